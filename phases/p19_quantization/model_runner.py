"""ModelRunner: turns a scheduled batch into flat model inputs plus the step's attention metadata."""
from __future__ import annotations

import torch

from .attention import StepContext
from .kv_cache import KVCache
from .model import Model
from .profiler import stage
from .scheduler import StepPlan
from .sequence import Sequence


def step_context(model: Model, cache: KVCache, backend, is_prefill: bool, positions, slots, last_rows,
                 **fields) -> StepContext:
    """A step's metadata (eager steps and captured ones alike), and what the backend derives from
    it, once for every layer. On a GPU the rotary tables go to the fused kernel whole
    (rope_store.py: it reads each token's row itself); elsewhere each token's row is gathered here."""
    rotary = model.rotary
    if cache.layers[0].is_cuda and model.fused and not model.cfg.is_mla:   # (MLA rotates its own part: mla.py)
        from .rope_store import rope_and_store          # triton: imported where it runs
        cos = sin = None
        fields["rope"] = (rope_and_store, positions, rotary.cos, rotary.sin)
    else:
        cos, sin = rotary.cos_sin(positions)
    step = StepContext(is_prefill, cos, sin, slots, last_rows, cache, backend, cache.layers[0].dtype, **fields)
    backend.prepare(step)
    return step


class ModelRunner:
    """Builds each step's inputs on the host, as plain int lists, and sends them to the device in
    two copies from pinned memory (one per dtype: int64 ids, positions, slots and rows; int32
    lengths and tables), neither waiting for the device. Nothing in a step reads a device value
    back: the only sync of a step is the sampler's fetch of the new token ids.

    A decode or verify step that fits a captured bucket replays its CUDA graph instead (`graphs`,
    a cuda_graph.GraphRunner, or None): a verify's k + 1 rows as k + 1 decode lanes. Prefill and
    mixed steps, and batches larger than the largest bucket, run eagerly as below."""

    def __init__(self, model: Model, cache: KVCache, device: str, backend):
        self.model, self.cache, self.device, self.backend = model, cache, device, backend
        self.block_size = cache.block_size
        self.pin = device.startswith("cuda")      # pinned host memory: an asynchronous copy
        self.graphs = None                        # set by the engine once it has captured

    @torch.inference_mode()
    def run(self, plan: StepPlan, scored: list[int] | None = None) -> torch.Tensor:
        """One forward step over a plan's sequences -> fp32 logits (sum(scored), vocab), in the
        plan's order: each sequence's last scored[b] rows (default 1; a verify's k + 1)."""
        if self.graphs is not None and self.graphs.can_run(plan, scored):
            return self.graphs.run(plan)               # decodes and verifies: one lane per row
        with stage("prepare inputs"):
            token_ids, step = self.prepare(plan, scored)
        return self.model(token_ids, step)

    def prepare(self, plan: StepPlan, scored: list[int] | None = None) -> tuple[torch.Tensor, StepContext]:
        """The step's flat token ids (T,) and its metadata: one path for both kinds of step.

        Sequence b computes q_b = num_new_tokens[b] tokens, positions [start, context): context =
        its K/V length once this step is written (num_computed_tokens, which the scheduler already
        advanced), start = context - q_b. A prompt's first chunk starts at 0, a later chunk where
        the one before it ended (its queries attend to the cached chunks too); a decode computes
        only the newest token. T = sum of q_b."""
        seqs, num_new_tokens = plan.seqs, plan.num_new_tokens
        B, width = len(seqs), max(len(seq.block_table) for seq in seqs)
        # Host ints: tokens, positions, slots (T,); cu_seqlens_q (B+1,); context_lens, last_rows (B,)
        tokens, positions, slots, cu_seqlens_q, context_lens = [], [], [], [0], []
        for seq, q in zip(seqs, num_new_tokens):
            context = seq.num_computed_tokens
            start = context - q
            tokens += seq.token_ids_from(start)[:q]             # a chunk stops short of the prompt's end
            positions += range(start, context)
            slots += [self.slot(seq, p) for p in range(start, context)]
            cu_seqlens_q.append(cu_seqlens_q[-1] + q)
            context_lens.append(context)
        # Each sequence's last row (sampled if it ends a prompt), or its last scored[b] rows: a
        # verify scores the newest token and each draft (row j predicts the token after row j's).
        last_rows = [row for end, n in zip(cu_seqlens_q[1:], scored or [1] * B) for row in range(end - n, end)]
        # (B, width) block ids, short tables padded with block 0: past a sequence's context
        # length nothing reads them (the torch reference masks what its gather copies).
        tables = [b for seq in seqs for b in seq.block_table + [0] * (width - len(seq.block_table))]
        # Indices (ids, positions, slots, rows) as int64; what attention kernels take as int32,
        # built as int32 on the host: two copies and no conversion on the device.
        ids, pos, slot, last = self.upload(torch.int64, tokens, positions, slots, last_rows)
        cu, lens, table = self.upload(torch.int32, cu_seqlens_q, context_lens, tables)
        step = self._context(plan.is_prefill, pos, slot, last, cu_seqlens_q=cu, cu_seqlens_q_host=cu_seqlens_q,
                             max_query_len=max(num_new_tokens), context_lens=lens, context_lens_host=context_lens,
                             max_context_len=max(context_lens), block_tables=table.view(B, width))
        return ids, step

    def slot(self, seq: Sequence, position: int) -> int:
        """Pool slot of a sequence's token: its block's first slot plus the offset inside it."""
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def _context(self, is_prefill: bool, positions, slots, last_rows, **fields) -> StepContext:
        """The step's metadata, and whatever the backend derives from it, once for every layer."""
        return step_context(self.model, self.cache, self.backend, is_prefill, positions, slots, last_rows, **fields)

    def upload(self, dtype: torch.dtype, *lists) -> list[torch.Tensor]:
        """Host int lists -> device tensors of `dtype`, all through one buffer and one copy."""
        sizes = [len(values) for values in lists]
        host = torch.tensor([v for values in lists for v in values], dtype=dtype, pin_memory=self.pin)
        return list(host.to(self.device, non_blocking=True).split(sizes))
