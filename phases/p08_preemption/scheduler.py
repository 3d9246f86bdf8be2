"""Scheduler: continuous batching with priorities and preemption (torch-free).

Every step is either one batched prefill (newly admitted sequences) or one batched decode (one
token for every running sequence). Order is by rank: lower priority value first, then earlier
arrival. At each step, swapped-out and waiting sequences are taken in rank order while seats,
the token budget and free blocks last (no overtaking); prefill goes first when anything was
admitted. A decode step gives every running sequence the slot its new token needs, best rank
first; when the pool is empty, the worst-ranked running sequence is preempted, by one of two
means (`preemption`):
  "recompute"  its blocks are dropped; it waits again and is re-prefilled from its prompt and
               the tokens it generated so far (cheap to hold, costs a prefill to resume)
  "swap"       its blocks are copied to host memory and freed; it resumes from the copy,
               bit-exact (costs two copies over the host link, holds host memory meanwhile)
The scheduler only decides; the engine does the copies a StepPlan asks for, before the forward.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .sequence import Sequence, Status

PREEMPTION = ("recompute", "swap")


@dataclass
class StepPlan:
    seqs: list[Sequence] = field(default_factory=list)      # the step's batch
    is_prefill: bool = False
    # (sequence, block ids): restore its saved K/V into these new blocks / copy these blocks out.
    # Ids, not the block table: a sequence resumed and preempted again in one plan has none left.
    swap_in: list[tuple[Sequence, list[int]]] = field(default_factory=list)
    swap_out: list[tuple[Sequence, list[int]]] = field(default_factory=list)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 preemption: str = "recompute"):
        if preemption not in PREEMPTION:
            raise ValueError(f"preemption must be one of {PREEMPTION}, got {preemption!r}")
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.preemption = preemption
        self.waiting: list[Sequence] = []        # sorted by rank
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []        # sorted by rank
        self.swapped_blocks: dict[int, int] = {}  # seq_id -> blocks its saved K/V fills
        self.num_preemptions = 0

    def check_fits(self, seq: Sequence, request: str = "the request") -> None:
        """Raise ValueError, naming `request`, for one that could never run even on an idle engine."""
        need, have = self.block_manager.blocks_for(seq.max_len), self.block_manager.num_blocks
        if need > have:
            raise ValueError(f"{request}: prompt + max_tokens ({seq.max_len} tokens) needs {need} KV blocks but "
                             f"the whole pool has {have}; give the KV cache more memory or lower max_tokens")
        if len(seq.prompt_ids) > self.max_num_batched_tokens:
            raise ValueError(f"{request}: its prompt ({len(seq.prompt_ids)} tokens) exceeds max_num_batched_tokens "
                             f"({self.max_num_batched_tokens}); prefill runs a prompt in one step")

    def add(self, seq: Sequence) -> None:
        self.check_fits(seq)
        bisect.insort(self.waiting, seq, key=lambda s: s.rank)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def schedule(self) -> StepPlan:
        """The next step: whom to resume or admit, whom to preempt, and the batch to run."""
        plan = StepPlan()
        self._resume_and_admit(plan)
        if plan.seqs:
            plan.is_prefill = True
            return plan
        self._grow_or_preempt(plan)
        plan.seqs = list(self.running)
        return plan

    def _resume_and_admit(self, plan: StepPlan) -> None:
        """Swapped and waiting sequences in rank order, while seats, tokens and blocks last."""
        tokens = 0
        for seq in sorted(self.swapped + self.waiting, key=lambda s: s.rank):
            if len(self.running) >= self.max_num_seqs:
                return
            if seq.status == Status.SWAPPED:
                if not self.block_manager.can_allocate(self.swapped_blocks[seq.seq_id]):
                    return
                self.block_manager.allocate(seq, self.swapped_blocks.pop(seq.seq_id))
                self.swapped.remove(seq)
                plan.swap_in.append((seq, list(seq.block_table)))
            else:
                # The budget may be passed by the step's first sequence only: a recomputed one
                # can be longer than any prompt (prompt + its output), and must still run.
                n, blocks = len(seq.prefill_ids), self.block_manager.blocks_for(seq.num_tokens)
                if (tokens and tokens + n > self.max_num_batched_tokens) or not self.block_manager.can_allocate(blocks):
                    return
                self.block_manager.allocate(seq, blocks)
                self.waiting.remove(seq)
                plan.seqs.append(seq)
                tokens += n
            seq.status = Status.RUNNING
            self.running.append(seq)

    def _grow_or_preempt(self, plan: StepPlan) -> None:
        """A slot for every running sequence's new token, best rank first; when none is free,
        preempt the worst-ranked running sequence (perhaps the one asking) and try again."""
        for seq in sorted(self.running, key=lambda s: s.rank):
            if seq.status != Status.RUNNING:
                continue                                  # preempted earlier in this loop
            while not self.block_manager.can_append(seq):
                victim = max(self.running, key=lambda s: s.rank)
                self._preempt(victim, plan)
                if victim is seq:
                    break
            else:
                self.block_manager.append_slot(seq)

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        self.running.remove(seq)
        blocks = self.block_manager.free(seq)             # they keep its K/V until the forward runs
        self.num_preemptions += 1
        if self.preemption == "swap":
            plan.swap_out.append((seq, blocks))
            self.swapped_blocks[seq.seq_id] = len(blocks)
            seq.status = Status.SWAPPED
            bisect.insort(self.swapped, seq, key=lambda s: s.rank)
        else:
            seq.status = Status.WAITING
            bisect.insort(self.waiting, seq, key=lambda s: s.rank)

    def check(self) -> None:
        """Raise AssertionError unless each request is in one queue, with that queue's status,
        and only the running ones hold blocks, whole (block_manager.py). Tests call it after
        every call."""
        for queue, status in ((self.waiting, Status.WAITING), (self.running, Status.RUNNING),
                              (self.swapped, Status.SWAPPED)):
            assert all(seq.status == status for seq in queue), f"the {status.value} queue holds another status"
        seqs = self.waiting + self.running + self.swapped
        assert len({seq.seq_id for seq in seqs}) == len(seqs), "a request is in two queues"
        assert set(self.swapped_blocks) == {seq.seq_id for seq in self.swapped}, "swap records disagree"
        self.block_manager.check(self.running)

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

    def finish(self, seqs: list[Sequence]) -> list[Sequence]:
        """After a step: free the blocks of every sequence that just finished; return those."""
        done = [seq for seq in seqs if seq.finished]
        for seq in done:
            self.block_manager.free(seq)
            seq.status = Status.FINISHED
        self.running = [seq for seq in self.running if not seq.finished]
        return done
