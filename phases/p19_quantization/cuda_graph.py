"""CUDA graphs: the decode step captured once per batch-size bucket, then replayed.

An eager decode step of a small model is host-bound: each layer launches a dozen kernels, and
the host spends ~10-20 us on every launch while the GPU finishes each in a few. A CUDA graph
records the whole step's launches once; replaying it is one launch, and the GPU runs the kernels
back to back. What a graph cannot do is change: every kernel, its grid and every pointer and
Python scalar it was given are frozen at capture. So:

  - one graph per batch-size bucket (1, 2, 4, 8, then steps of 16): a step of n lanes (one per
    decoding sequence) replays the smallest bucket >= n, its lanes n..bucket-1 padded;
  - a speculative verify (p13: a sequence's newest token and k drafts) is k + 1 decode lanes,
    lane j at position s + j with context s + j + 1: causal, with no graph of its own;
  - the step's inputs live in static device buffers, the same memory in every replay: the host
    writes the step's rows into a pinned host copy, and ONE host-to-device copy, captured as the
    graph's first node, sends them: a step's host work is writing rows and one replay call;
  - the block tables are as wide as the longest sequence could ever need (max_model_len), and a
    kernel's loop over keys is bounded by context_lens, a device tensor, never by a host int;
  - padded lanes compute garbage harmlessly: token 0 at position 0, its K/V written to a scratch
    block that no sequence owns (the pool's last block), context length 1 so its attention reads
    only that scratch slot;
  - the graphs share one memory pool: captured largest first, each smaller one reuses the
    largest one's activations (only one replays at a time).

Static buffer layout, int32, one row per lane, so that the first n lanes are one contiguous
block (n, 4 + W) and one copy fills them:
    [token id, position, slot, context length, block table (W columns, 0 past its end)]
"""
from __future__ import annotations

import time

import torch

from .model_runner import step_context
from .profiler import stage

TOKEN, POSITION, SLOT, CONTEXT_LEN, TABLE = 0, 1, 2, 3, 4     # columns of the static buffer


def buckets_up_to(max_batch: int) -> list[int]:
    """Batch sizes that get a graph: 1, 2, 4, 8, then every 16 up to max_batch (always included)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16)) + [max_batch]
    return sorted(set(sizes))


def pick_bucket(buckets: list[int], n: int) -> int | None:
    """The smallest bucket that holds n lanes, or None: the step runs eagerly."""
    return next((b for b in buckets if b >= n), None)


def dense(column: torch.Tensor) -> torch.Tensor:
    """A copy with unit strides (a kernel may check them; .contiguous() keeps a one-row view's
    stride): one small copy kernel inside the graph."""
    return torch.empty(column.shape, dtype=column.dtype, device=column.device).copy_(column)


def lanes_of(seqs) -> tuple[list, list[int], list[int]]:
    """Per lane: the sequence it computes for, its token, its position. A sequence's tokens to
    compute are its newest (pending) one and its drafts; num_computed_tokens counts them all."""
    if not any(seq.draft_ids for seq in seqs):          # plain decode: one lane each
        return seqs, [seq.last_token for seq in seqs], [seq.num_computed_tokens - 1 for seq in seqs]
    owners, tokens, positions = [], [], []
    for seq in seqs:
        new = [seq.last_token, *seq.draft_ids]
        first = seq.num_computed_tokens - len(new)
        owners += [seq] * len(new)
        tokens += new
        positions += range(first, first + len(new))
    return owners, tokens, positions


class GraphRunner:
    """Decode and verify steps of up to max(buckets) lanes (rows) through captured graphs.

    model, cache, backend: the engine's; width: block-table columns (blocks of the longest
    sequence); scratch_block: a pool block no sequence owns. capture=False builds the same static
    buffers and runs the same padded forward eagerly, with no graph: the CPU tests' path, which
    checks buckets, padding and buffer filling exactly as a replay sees them.
    """

    def __init__(self, model, cache, backend, buckets: list[int], width: int, scratch_block: int,
                 capture: bool = True):
        self.model, self.cache, self.backend = model, cache, backend
        self.buckets, self.width, self.scratch_block = sorted(buckets), width, scratch_block
        self.block_size = cache.block_size
        device = cache.layers[0].device
        rows, cols = self.buckets[-1], TABLE + width
        # Host side: pinned, written row by row each step; device side: what the graphs read.
        self.host = torch.zeros(rows, cols, dtype=torch.int32, pin_memory=device.type == "cuda")
        self.host_rows = self.host.numpy()
        self.lane_tables: list[list[int]] = [[] for _ in range(rows)]   # per lane: the table written
        self.static = torch.zeros(rows, cols, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # Every graph writes its logits into the first rows of one buffer: a graph's own output
        # would stay allocated for its life, 20 buckets x (bucket, vocab) fp32 = ~1 GiB for a
        # 128k vocabulary. The copy costs one kernel.
        self.logits = torch.empty(rows, model.cfg.vocab_size, dtype=torch.float32, device=device)
        self.capture_seconds, self.graph_bytes = 0.0, 0
        self.used = rows                     # lanes [used, rows) hold padding
        self.fill([])
        self.static.copy_(self.host)
        if capture:
            self._capture_all()

    # --- per step --------------------------------------------------------------------------
    def can_run(self, plan, scored: list[int] | None = None) -> bool:
        """Decodes and verifies only, every row scored, within the largest bucket: each sequence
        computes its newest token and its drafts (1 + k rows: a verify), nothing else. Newest
        means its last: a one-token chunk of a prompt is one row too, but not at the prompt's end
        (a budget of 1, or one token left of it), and a lane feeds last_token (lanes_of)."""
        rows = plan.num_new_tokens
        return all(n == 1 + len(seq.draft_ids) and seq.num_computed_tokens == seq.num_tokens + len(seq.draft_ids)
                   for seq, n in zip(plan.seqs, rows)) \
            and (scored or [1] * len(rows)) == rows and sum(rows) <= self.buckets[-1] \
            and all(len(seq.block_table) <= self.width for seq in plan.seqs)

    @torch.inference_mode()
    def run(self, plan) -> torch.Tensor:
        """A plan can_run() takes -> fp32 logits (rows, vocab), one row per lane in plan order: a
        view of the static output, valid until the next step (the engine samples from it first)."""
        with stage("prepare inputs"):
            n = self.fill(plan.seqs)
        bucket = pick_bucket(self.buckets, n)
        if bucket in self.graphs:
            # The graph's first node copies host rows [0, bucket) to the device when the GPU
            # reaches it, so the host must not write them again before then: it does not, the
            # engine reads this step's tokens back (a sync) before it plans the next.
            self.graphs[bucket].replay()
            return self.logits[:n]
        self.static[:bucket].copy_(self.host[:bucket])
        return self._forward(bucket)[:n]

    def fill(self, seqs) -> int:
        """Write the host buffer's lanes, one per token to compute, and return how many: a
        decode's newest token, or a verify's newest and each draft. A verify's k + 1 rows are k + 1
        decode lanes of one sequence, consecutive, lane j at position first + j with context
        first + j + 1: it sees the keys up to its own, written this very step before attention
        reads them (causal, as the verify's chunk is). Whole columns at once (one numpy call each,
        not one per lane and field); a lane's block table only where it changed; padding only in
        lanes a sequence used since they were padded."""
        owners, tokens, positions = lanes_of(seqs)
        n, rows, bs = len(owners), self.host_rows, self.block_size
        for lane, seq in enumerate(owners):
            if self.lane_tables[lane] != seq.block_table:
                self._write_table(lane, seq.block_table)
        rows[:n, TOKEN] = tokens
        rows[:n, POSITION] = positions
        rows[:n, CONTEXT_LEN] = rows[:n, POSITION] + 1
        rows[:n, SLOT] = [seq.block_table[p // bs] * bs + p % bs for seq, p in zip(owners, positions)]
        for lane in range(n, self.used):
            self._pad(lane)
        self.used = n
        return n

    def _write_table(self, lane: int, table: list[int]) -> None:
        """Row `lane`'s block table. A decoding sequence keeps its lane while the batch does not
        change, and its table grows by one block per block_size tokens: then only the new blocks
        are written. Columns a previous occupant wrote past the new table's end become 0 again: a
        stale column would point a longer context at another sequence's block."""
        old = self.lane_tables[lane]
        used, n = len(old), len(table)
        start = used if table[:used] == old else 0          # the old table is a prefix: append
        self.host_rows[lane, TABLE + start:TABLE + n] = table[start:]
        if used > n:
            self.host_rows[lane, TABLE + n:TABLE + used] = 0
        self.lane_tables[lane] = list(table)

    def _pad(self, lane: int) -> None:
        """A padded lane: token 0 at position 0, written to and read from the scratch block only."""
        row = self.host_rows[lane]
        row[TOKEN], row[POSITION], row[CONTEXT_LEN] = 0, 0, 1
        row[SLOT] = self.scratch_block * self.block_size
        if self.lane_tables[lane] != [self.scratch_block]:
            self._write_table(lane, [self.scratch_block])

    def forget(self) -> None:
        """Write every lane anew at the next step (after a failure cut a fill() short: the
        record of what the host rows hold may be wrong): as after construction, in effect."""
        self.host_rows[:] = 0
        self.lane_tables = [[] for _ in self.lane_tables]
        self.used = len(self.lane_tables)

    # --- the captured step -----------------------------------------------------------------
    def _forward(self, bucket: int) -> torch.Tensor:
        """The decode step over lanes [0, bucket) of the static buffer: what a graph records.
        Everything it reads comes from the static buffer; every size is the bucket's."""
        lanes = self.static[:bucket]
        token_ids = lanes[:, TOKEN].long()
        positions = lanes[:, POSITION].long()
        context_lens = dense(lanes[:, CONTEXT_LEN])
        rows = torch.arange(bucket, device=lanes.device)
        step = step_context(self.model, self.cache, self.backend, False, positions, lanes[:, SLOT].long(), rows,
                            cu_seqlens_q=torch.arange(bucket + 1, dtype=torch.int32, device=lanes.device),
                            cu_seqlens_q_host=list(range(bucket + 1)), max_query_len=1,
                            context_lens=context_lens, context_lens_host=[],   # (prefill's only)
                            # a capture-time bound: the kernels loop to context_lens, not to this
                            max_context_len=self.width * self.block_size,
                            block_tables=dense(lanes[:, TABLE:]))
        return self.model(token_ids, step)

    def _capture_all(self) -> None:
        """Warm up every bucket eagerly (kernels compile and autotune now, not inside a capture),
        then capture largest first into one shared pool. Graph memory: what the pool reserved."""
        start, device = time.perf_counter(), self.static.device
        with torch.inference_mode():
            for bucket in self.buckets:
                self._forward(bucket)
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()            # (capture empties it too: count only the graphs' pool)
            before = torch.cuda.memory_reserved(device)
            pool = None
            for bucket in reversed(self.buckets):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    # a memcpy node from the pinned host rows: a step issues one call, the replay
                    self.static[:bucket].copy_(self.host[:bucket], non_blocking=True)
                    self.logits[:bucket].copy_(self._forward(bucket))
                pool = pool or graph.pool()
                self.graphs[bucket] = graph
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        self.capture_seconds = time.perf_counter() - start
        self.graph_bytes = torch.cuda.memory_reserved(device) - before
