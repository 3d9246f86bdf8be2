"""Scheduler: continuous batching over a waiting and a running queue (torch-free).

Every step is either one batched prefill (newly admitted prompts) or one batched decode (one
token for every running sequence). Admission is first come, first served, and happens at every
step, so a request that arrives while others decode joins at the next step instead of waiting
for the whole batch to drain (static batching's weakness). Prefill goes first when anything can
be admitted, which keeps the running batch large (vLLM's default before chunked prefill).
"""
from __future__ import annotations

from collections import deque

from .block_manager import BlockManager
from .sequence import Sequence, Status


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

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
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """The sequences of the next step and whether it is a prefill step."""
        admitted = self._admit()
        if admitted:
            return admitted, True
        for seq in self.running:
            if not self.block_manager.can_append(seq):   # unreachable: admission reserved it
                raise RuntimeError(f"no KV block for sequence {seq.seq_id}")
            self.block_manager.append_slot(seq)
        return list(self.running), False

    def _admit(self) -> list[Sequence]:
        """Move waiting sequences to running, in arrival order, while seats, tokens and blocks last."""
        admitted, tokens = [], 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if tokens + seq.num_tokens > self.max_num_batched_tokens or not self.block_manager.can_allocate(seq):
                break                                    # first come, first served: no overtaking
            self.block_manager.allocate(seq)
            seq.status = Status.RUNNING
            self.running.append(self.waiting.popleft())
            admitted.append(seq)
            tokens += seq.num_tokens
        return admitted

    def abort(self, seq: Sequence) -> None:
        """Drop a request wherever it is and give its blocks back: how a failed step is undone.
        Safe on a request that already finished (its blocks went back then)."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
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
