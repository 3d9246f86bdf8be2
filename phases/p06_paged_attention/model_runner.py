"""ModelRunner: turns a scheduled batch into flat model inputs plus the step's attention metadata."""
from __future__ import annotations

import torch

from .attention import StepContext
from .kv_cache import KVCache
from .model import Model
from .profiler import stage
from .sequence import Sequence


class ModelRunner:
    """Builds each step's inputs on the host, as plain int lists, and sends them to the device in
    two copies from pinned memory (one per dtype: int64 ids, positions, slots and rows; int32
    lengths and tables), neither waiting for the device. Nothing in a step reads a device value
    back: the only sync of a step is the sampler's fetch of the new token ids."""

    def __init__(self, model: Model, cache: KVCache, device: str, backend):
        self.model, self.cache, self.device, self.backend = model, cache, device, backend
        self.block_size = cache.block_size
        self.pin = device.startswith("cuda")      # pinned host memory: an asynchronous copy

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
        last_rows = [end - 1 for end in cu_seqlens[1:]]
        ids, pos, slot, last, cu = self.upload(tokens, positions, slots, last_rows, cu_seqlens)
        step = self._context(True, pos, slot, last, cu_seqlens=cu.int(), cu_seqlens_host=cu_seqlens,
                             max_prompt_len=max(len(seq.prompt_ids) for seq in seqs))
        return ids, step

    def prepare_decode(self, seqs: list[Sequence]) -> tuple[torch.Tensor, StepContext]:
        """One token per sequence, its newest, at position num_tokens - 1: (B,) ids."""
        B, width = len(seqs), max(len(seq.block_table) for seq in seqs)
        positions = [seq.num_tokens - 1 for seq in seqs]
        context_lens = [seq.num_tokens for seq in seqs]          # including the token written now
        # (B, width) block ids, short tables padded with block 0: past a sequence's context
        # length nothing reads them (the torch reference masks what its gather copies).
        tables = [b for seq in seqs for b in seq.block_table + [0] * (width - len(seq.block_table))]
        ids, pos, slot, last, lens, table = self.upload(
            [seq.last_token for seq in seqs], positions, [self.slot(s, p) for s, p in zip(seqs, positions)],
            range(B), context_lens, tables)
        step = self._context(False, pos, slot, last, block_tables=table.view(B, width).int(),
                             context_lens=lens.int(), max_context_len=max(context_lens))
        return ids, step

    def slot(self, seq: Sequence, position: int) -> int:
        """Pool slot of a sequence's token: its block's first slot plus the offset inside it."""
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def _context(self, is_prefill: bool, positions, slots, last_rows, **fields) -> StepContext:
        """The step's metadata, and whatever the backend derives from it, once for every layer."""
        cos, sin = self.model.rotary.cos_sin(positions)
        step = StepContext(is_prefill, cos, sin, slots, last_rows, self.cache, self.backend,
                           self.cache.layers[0].dtype, **fields)
        self.backend.prepare(step)
        return step

    def upload(self, *lists) -> list[torch.Tensor]:
        """Host int lists -> int64 device tensors, all through one buffer and one copy."""
        sizes = [len(values) for values in lists]
        host = torch.tensor([v for values in lists for v in values], dtype=torch.int64, pin_memory=self.pin)
        return list(host.to(self.device, non_blocking=True).split(sizes))
