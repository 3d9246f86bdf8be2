"""Scheduler: continuous batching with chunked prefill, priorities and preemption (torch-free).

Every step is one batch drawn from one token budget, max_num_batched_tokens. A sequence has a
count of computed tokens (its K/V in the pool) and computes the rest over one or more steps:
  1. decodes first: one token for every running sequence that has one left to compute (they
     always fit: len(running) <= max_num_seqs <= the budget, which EngineConfig checks);
  2. then the partly prefilled prompts, best rank first, each a chunk of what the budget has left;
  3. then swapped-out and waiting sequences in rank order while seats, the budget and free blocks
     last (no overtaking): a resumed one computes nothing this step (its K/V is copied back), a
     new one computes its prompt, or as much of it as the budget has left: its first chunk.
At most max_num_partial_prefills = K prompts are part way at once, and a chunk is at most
budget // K tokens: with K = 1 one prompt at a time takes all the budget the decodes leave; with
K > 1 a short prompt arriving behind a long one shares the step with it instead of waiting.
So a long prompt is prefilled in chunks between decode steps that keep running beside it, each
chunk attending to the ones already in the pool; the step that computes a prompt's last token
samples its first output. Order is by rank: lower priority value first, then earlier arrival.
When a sequence's next tokens need a block and none is free, the worst-ranked running sequence
this step has not planned yet (perhaps the one asking) is preempted, by one of two means
(`preemption`):
  "recompute"  its blocks are dropped; it waits again and is re-prefilled from its prompt and
               the tokens it generated so far (cheap to hold, costs a prefill to resume)
  "swap"       its blocks are copied to host memory and freed; it resumes from the copy,
               bit-exact (costs two copies over the host link, holds host memory meanwhile)
The scheduler only decides; the engine does the copies a StepPlan asks for, before the forward.
Prefix caching: a waiting sequence starts with the longest prefix of its tokens whose K/V is
cached (block_manager.py) and computes only the rest, all of it or in chunks as above. Admission
is cache-aware: among waiting sequences of one priority, the longest cached prefix goes first
(cheap to admit, and its blocks might be evicted while it waits), except that one passed over
MAX_OVERTAKES times goes in arrival order: a request that hits nothing is never starved. One whose
next block another sequence computes in this very step waits a step and reads it then.
After each step, written() hands the blocks the step filled to the cache.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .sequence import Sequence, Status

PREEMPTION = ("recompute", "swap")
MAX_OVERTAKES = 32   # cache-aware admission: later arrivals a waiting request lets pass, at most


@dataclass
class StepPlan:
    budget: int                  # max_num_batched_tokens: the most new tokens one step computes
    is_prefill: bool = False     # does any sequence compute more than one token (a backend's prefill path)
    seqs: list[Sequence] = field(default_factory=list)      # the step's batch, in row order
    num_new_tokens: list[int] = field(default_factory=list)  # per sequence: tokens it computes now
    # (sequence, block ids): restore its saved K/V into these new blocks / copy these blocks out.
    # Ids, not the block table: a sequence resumed and preempted again in one plan has none left.
    swap_in: list[tuple[Sequence, list[int]]] = field(default_factory=list)
    swap_out: list[tuple[Sequence, list[int]]] = field(default_factory=list)

    num_batched_tokens: int = 0  # the step's new tokens, T: the rows of every activation in its forward
                                 # (kept as they are added: summing per sequence is O(B^2) host time)

    @property
    def budget_left(self) -> int:
        return self.budget - self.num_batched_tokens

    def add(self, seq: Sequence, n: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(n)
        self.num_batched_tokens += n

    def compute(self, seq: Sequence, n: int) -> None:
        """Seq computes its next n tokens in this step: from now on they count as computed."""
        self.add(seq, n)
        seq.num_computed_tokens += n


def by_rank(seqs: list[Sequence]) -> list[Sequence]:
    return sorted(seqs, key=lambda s: s.rank)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 preemption: str = "recompute", max_num_partial_prefills: int = 1):
        if preemption not in PREEMPTION:
            raise ValueError(f"preemption must be one of {PREEMPTION}, got {preemption!r}")
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_partial_prefills = max_num_partial_prefills
        self.max_chunk = max(1, max_num_batched_tokens // max_num_partial_prefills)   # tokens of one prompt per step
        self.preemption = preemption
        self.waiting: list[Sequence] = []        # sorted by rank
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []        # sorted by rank
        self.swapped_blocks: dict[int, int] = {}  # seq_id -> blocks its saved K/V fills
        self.num_preemptions = 0
        self.cache_queries = self.cache_hits = 0   # prompt tokens looked up / found, every admission

    def check_fits(self, seq: Sequence, request: str = "the request") -> None:
        """Raise ValueError, naming `request`, for one that could never run even on an idle engine.
        (A prompt longer than the token budget is fine: it is prefilled in chunks.)"""
        need, have = self.block_manager.blocks_for(seq.max_len), self.block_manager.num_blocks
        if need > have:
            raise ValueError(f"{request}: prompt + max_tokens ({seq.max_len} tokens) needs {need} KV blocks but "
                             f"the whole pool has {have}; give the KV cache more memory or lower max_tokens")

    def add(self, seq: Sequence) -> None:
        self.check_fits(seq)
        bisect.insort(self.waiting, seq, key=lambda s: s.rank)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def schedule(self) -> StepPlan:
        """The next step: decodes, then prefill chunks, then whom to resume or admit."""
        plan = StepPlan(budget=self.max_num_batched_tokens)
        ranked = by_rank(self.running)                    # (sorted once: host time is the step's now)
        decodes = [seq for seq in ranked if seq.num_pending_tokens == 1]
        prefills = [seq for seq in ranked if seq.num_pending_tokens > 1]
        preempted = self.num_preemptions
        for seq in decodes + prefills:
            n = min(seq.num_pending_tokens, plan.budget_left, self.max_chunk)
            if seq.status == Status.RUNNING and n > 0:    # (not preempted earlier in this loop)
                self._grow_or_preempt(seq, n, plan)
        if self.num_preemptions == preempted:   # a step that had to preempt admits nobody: the one
            self._resume_and_admit(plan)        # just preempted would come straight back
        plan.is_prefill = any(n > 1 for n in plan.num_new_tokens)
        return plan

    def _grow_or_preempt(self, seq: Sequence, n: int, plan: StepPlan) -> None:
        """Blocks for seq's next n tokens, then its row in the plan. While none are free, preempt
        the worst-ranked running sequence not planned yet (perhaps seq itself): a planned one
        has had its blocks grown for this step and must keep them."""
        while not self.block_manager.can_grow(seq, seq.num_computed_tokens + n):
            victim = max((s for s in self.running if s not in plan.seqs), key=lambda s: s.rank)
            self._preempt(victim, plan)
            if victim is seq:
                return
        self.block_manager.grow(seq, seq.num_computed_tokens + n)
        plan.compute(seq, n)

    def _resume_and_admit(self, plan: StepPlan) -> None:
        """Swapped and waiting sequences in admission order, while seats, tokens and blocks last.
        A resumed sequence computes nothing this step (its K/V is copied back); it runs next."""
        for seq in self._admission_order():
            if len(self.running) >= self.max_num_seqs:
                return
            if seq.status == Status.SWAPPED:
                if not self.block_manager.can_allocate(self.swapped_blocks[seq.seq_id]) or \
                        not self._may_leave_partial(seq, 0):
                    return
                self.block_manager.allocate(seq, self.swapped_blocks.pop(seq.seq_id))
                self.swapped.remove(seq)
                plan.swap_in.append((seq, list(seq.block_table)))
            elif self._waits_for_prefix(seq, plan):
                continue                      # it reads that prefix next step instead of computing it
            elif not self._admit(seq, plan):
                return
            seq.status = Status.RUNNING
            self.running.append(seq)

    def _admission_order(self) -> list[Sequence]:
        """Swapped sequences, and waiting ones passed over MAX_OVERTAKES times, in rank order;
        then the other waiting ones, longest cached prefix first; lower priority values first."""
        def key(seq: Sequence):
            due = seq.status == Status.SWAPPED or seq.num_overtaken >= MAX_OVERTAKES
            hit = 0 if due else len(self.block_manager.match(seq))
            return seq.priority, not due, -hit, seq.seq_id
        return sorted(self.swapped + self.waiting, key=key)

    def _waits_for_prefix(self, seq: Sequence, plan: StepPlan) -> bool:
        """Does a sequence of this step compute the block after seq's cached prefix, the same
        tokens after the same prefix? Then seq waits: the tree has that block after the step
        (SGLang's in-batch prefix check). It never waits long: the other one is computing."""
        bm, bs = self.block_manager, self.block_manager.block_size
        hit, keys = bm.match(seq), seq.block_keys(bs)
        h = len(hit)
        if not bm.tree.enabled or (seq.num_tokens - 1) // bs <= h:     # no full block left to read
            return False
        for other, n in zip(plan.seqs, plan.num_new_tokens):   # it writes positions [computed - n, computed)
            writes_block = other.num_computed_tokens - n < (h + 1) * bs and h * bs < other.num_computed_tokens
            same_tokens = other.block_keys(bs)[h:h + 1] == keys[h:h + 1] and bm.owners[other.seq_id][:h] == hit
            if writes_block and same_tokens:
                return True
        return False

    def _admit(self, seq: Sequence, plan: StepPlan) -> bool:
        """A waiting sequence: its cached prefix, then blocks for the rest of its tokens or for a
        first chunk of them. False (and nothing changed) when the budget or the blocks fall short."""
        bm = self.block_manager
        hit = bm.match(seq)
        seq.num_computed_tokens = len(hit) * bm.block_size        # their K/V is in the pool already
        n = min(seq.num_pending_tokens, plan.budget_left, self.max_chunk)  # all, or a first chunk
        blocks = bm.blocks_for(seq.num_computed_tokens + n) - len(hit)
        if n == 0 or not self._may_leave_partial(seq, n) or not bm.can_allocate(blocks, hit):
            seq.num_computed_tokens = 0
            return False
        bm.allocate(seq, blocks, hit)
        self.cache_queries += seq.num_tokens
        self.cache_hits += seq.num_computed_tokens
        if seq.num_cached_tokens is None:
            seq.num_cached_tokens = seq.num_computed_tokens
        self.waiting.remove(seq)
        for earlier in self.waiting:          # sorted by rank: the ones that arrived before it come first
            if earlier.rank > seq.rank:
                break
            earlier.num_overtaken += earlier.priority == seq.priority
        plan.compute(seq, n)
        return True

    def _may_leave_partial(self, seq: Sequence, n: int) -> bool:
        """May seq run n tokens now? Yes if at most one is left after them (the next step's one
        token is a decode's); else it stays partly prefilled, and at most max_num_partial_prefills
        prompts may be at once (each holds blocks and a seat while it waits for budget)."""
        if seq.num_pending_tokens - n <= 1:
            return True
        return sum(s.num_pending_tokens > 1 for s in self.running) < self.max_num_partial_prefills

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        self.running.remove(seq)
        blocks = self.block_manager.free(seq)             # they keep its K/V until the forward runs
        self.num_preemptions += 1
        if self.preemption == "swap":                     # its computed tokens come back with its K/V
            plan.swap_out.append((seq, blocks))
            self.swapped_blocks[seq.seq_id] = len(blocks)
            seq.status = Status.SWAPPED
            bisect.insort(self.swapped, seq, key=lambda s: s.rank)
        else:                                             # its K/V is gone: all of it is computed again
            seq.num_computed_tokens = 0
            seq.status = Status.WAITING
            bisect.insort(self.waiting, seq, key=lambda s: s.rank)

    def check(self, others: list[Sequence] = ()) -> None:
        """Raise AssertionError unless each request is in one queue, with that queue's status,
        and only the running ones (and `others`, holding blocks outside the queues) hold blocks,
        whole (block_manager.py). Tests call it after every call."""
        for queue, status in ((self.waiting, Status.WAITING), (self.running, Status.RUNNING),
                              (self.swapped, Status.SWAPPED)):
            assert all(seq.status == status for seq in queue), f"the {status.value} queue holds another status"
        seqs = self.waiting + self.running + self.swapped
        assert len({seq.seq_id for seq in seqs}) == len(seqs), "a request is in two queues"
        assert set(self.swapped_blocks) == {seq.seq_id for seq in self.swapped}, "swap records disagree"
        self.block_manager.check(self.running + list(others))

    def abort(self, seq: Sequence) -> None:
        """Drop a request wherever it is and give its blocks back: how a failed step is undone.
        Safe on a request that already finished (its blocks went back then)."""
        for queue in (self.waiting, self.running, self.swapped):
            if seq in queue:
                queue.remove(seq)
        self.swapped_blocks.pop(seq.seq_id, None)
        if self.block_manager.holds(seq):
            self.block_manager.free(seq)
        if not seq.finished:
            seq.finish_reason = "abort"
        seq.status = Status.FINISHED

    def written(self, seqs: list[Sequence]) -> None:
        """After a step wrote its K/V: the full blocks it filled join the prefix cache."""
        for seq in seqs:
            self.block_manager.cache(seq)

    def finish(self, seqs: list[Sequence]) -> list[Sequence]:
        """After a step: free the blocks of every sequence that just finished; return those."""
        done = [seq for seq in seqs if seq.finished]
        for seq in done:
            self.block_manager.free(seq)
            seq.status = Status.FINISHED
        self.running = [seq for seq in self.running if not seq.finished]
        return done
