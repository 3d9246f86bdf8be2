"""BlockManager: hands out fixed-size KV blocks from a free list (torch-free).

The KV pool is cut into `num_blocks` blocks of `block_size` token slots. A sequence owns a block
table, the list of its block ids in token order: token i lives in slot
    block_table[i // block_size] * block_size + i % block_size
of the pool. Blocks are allocated as sequences grow: on admission, blocks for a prompt's first
chunk; then more each time its next chunk or token passes the end of its last block. Nothing is
reserved for a sequence's worst case (prompt + max_tokens), so more sequences fit at once than
under reservation, and the pool can run out mid-step: the scheduler then preempts one
(scheduler.py). All of a sequence's blocks come back when it finishes or is preempted.
"""
from __future__ import annotations

from collections import deque

from .sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"need positive num_blocks and block_size, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_ids: deque[int] = deque(range(num_blocks))   # FIFO: a freed block is reused last
        self.owners: set[int] = set()        # seq_ids that hold blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)        # ceil division

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self.free_ids)

    def allocate(self, seq: Sequence, num_blocks: int) -> None:
        """Give a sequence that holds nothing `num_blocks` blocks: for the tokens a prefill writes,
        or for the K/V a swapped-out sequence brings back."""
        if self.holds(seq):
            raise RuntimeError(f"sequence {seq.seq_id} already holds blocks")
        if not self.can_allocate(num_blocks):
            raise RuntimeError(f"sequence {seq.seq_id} does not fit; call can_allocate first")
        seq.block_table = [self.free_ids.popleft() for _ in range(num_blocks)]
        self.owners.add(seq.seq_id)

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Are there blocks for the sequence's first num_tokens positions (a decode's next token,
        or a prompt's next chunk)?"""
        return self._blocks_short(seq, num_tokens) <= len(self.free_ids)

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Extend the block table to cover positions [0, num_tokens)."""
        seq.block_table += [self.free_ids.popleft() for _ in range(self._blocks_short(seq, num_tokens))]

    def holds(self, seq: Sequence) -> bool:
        return seq.seq_id in self.owners

    def free(self, seq: Sequence) -> list[int]:
        """Return every block of a sequence to the pool; the ids it held, in token order."""
        if seq.seq_id not in self.owners:
            raise RuntimeError(f"sequence {seq.seq_id} freed twice (or never allocated)")
        self.owners.remove(seq.seq_id)
        blocks, seq.block_table = seq.block_table, []
        self.free_ids.extend(blocks)
        return blocks

    def check(self, holders: list[Sequence]) -> None:
        """Raise AssertionError unless every block is free or held by exactly one of `holders` (the
        sequences that hold blocks), once. Tests call it after every call."""
        assert self.owners == {seq.seq_id for seq in holders}, "the owners are not the holding sequences"
        blocks = sorted([*self.free_ids, *(block for seq in holders for block in seq.block_table)])
        assert blocks == list(range(self.num_blocks)), "a block is lost, or free or held twice"

    def rebuild(self) -> None:
        """Every block free again, the accounting built anew: after a failure (an error, a Ctrl-C)
        cut a grow or a free in half, once every request was aborted (nobody holds a block)."""
        self.free_ids = deque(range(self.num_blocks))
        self.owners = set()

    def _blocks_short(self, seq: Sequence, num_tokens: int) -> int:
        # Position num_tokens - 1 is the last one the step writes: a new block is needed exactly
        # when it lies past the table's last block (the off-by-one trap lives here).
        return max(0, self.blocks_for(num_tokens) - len(seq.block_table))
