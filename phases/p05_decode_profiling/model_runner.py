"""ModelRunner: turns a scheduled batch into flat model inputs plus the step's attention metadata."""
from __future__ import annotations

import torch

from .attention import StepContext
from .kv_cache import KVCache
from .model import Model
from .profiler import stage
from .sequence import Sequence


class ModelRunner:
    def __init__(self, model: Model, cache: KVCache, device: str, float_mask: bool = True):
        self.model, self.cache, self.device = model, cache, device
        self.block_size = cache.block_size
        self.float_mask = float_mask

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], is_prefill: bool) -> torch.Tensor:
        """One forward step over the scheduled sequences -> fp32 logits (B, vocab), in order."""
        with stage("prepare inputs"):
            token_ids, step = self.prepare_prefill(seqs) if is_prefill else self.prepare_decode(seqs)
        return self.model(token_ids, step)

    def prepare_prefill(self, seqs: list[Sequence]) -> tuple[torch.Tensor, StepContext]:
        """Every prompt whole, concatenated: (T,) ids, T = sum of prompt lengths."""
        tokens, positions, slots, cu_seqlens = [], [], [], [0]
        for seq in seqs:
            n = len(seq.prompt_ids)
            tokens += seq.prompt_ids
            positions += range(n)
            slots += [self.slot(seq, i) for i in range(n)]
            cu_seqlens.append(cu_seqlens[-1] + n)
        step = self._context(True, positions, slots, [end - 1 for end in cu_seqlens[1:]], cu_seqlens=cu_seqlens)
        return self._ints(tokens), step

    def prepare_decode(self, seqs: list[Sequence]) -> tuple[torch.Tensor, StepContext]:
        """One token per sequence, its newest, at position num_tokens - 1: (B,) ids."""
        positions = [seq.num_tokens - 1 for seq in seqs]
        context_lens = [seq.num_tokens for seq in seqs]          # including the token written now
        step = self._context(False, positions, [self.slot(s, p) for s, p in zip(seqs, positions)],
                             range(len(seqs)), kv_index=self._kv_index(seqs, context_lens),
                             context_lens=context_lens, key_mask=self._key_mask(context_lens))
        return self._ints([seq.last_token for seq in seqs]), step

    def slot(self, seq: Sequence, position: int) -> int:
        """Pool slot of a sequence's token: its block's first slot plus the offset inside it."""
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def _context(self, is_prefill: bool, positions, slots, last_rows, **fields) -> StepContext:
        cos, sin = self.model.rotary.cos_sin(self._ints(positions))
        return StepContext(is_prefill, cos, sin, self._ints(slots), self._ints(last_rows), self.cache, **fields)

    def _block_tables(self, seqs: list[Sequence]) -> torch.Tensor:
        """(B, max_blocks) block ids; short tables padded with block 0 (whose keys key_mask hides)."""
        width = max(len(seq.block_table) for seq in seqs)
        return self._ints([seq.block_table + [0] * (width - len(seq.block_table)) for seq in seqs])

    def _kv_index(self, seqs: list[Sequence], context_lens: list[int]) -> torch.Tensor:
        """(B, S) pool slot of key j of sequence b, S = max(context_lens): the slot() formula over
        the whole batch at once. Past a sequence's end it points at stale or padding slots
        (block 0), which key_mask hides. Built once per step, shared by every layer."""
        tables = self._block_tables(seqs)                        # (B, max_blocks)
        j = torch.arange(max(context_lens), device=self.device)  # (S,)
        return tables[:, j // self.block_size] * self.block_size + j % self.block_size

    def _key_mask(self, context_lens: list[int]) -> torch.Tensor:
        """(B, 1, 1, S): key j of sequence b is real iff j < context_lens[b]. As a bool mask SDPA
        turns it into an additive one (0 real, -inf hidden) in every call: 3 launches per layer in
        the profile. Made additive here, once per step, in the dtype of q and k (the pool's)."""
        keys = torch.arange(max(context_lens), device=self.device)
        real = (keys[None, :] < self._ints(context_lens)[:, None])[:, None, None, :]
        if not self.float_mask:
            return real
        additive = torch.zeros(real.shape, dtype=self.cache.layers[0].dtype, device=self.device)
        return additive.masked_fill_(~real, float("-inf"))

    def _ints(self, values) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.int64, device=self.device)
