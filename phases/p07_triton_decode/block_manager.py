"""BlockManager: hands out fixed-size KV blocks from a free list (torch-free).

The KV pool is cut into `num_blocks` blocks of `block_size` token slots. A sequence owns a block
table, the list of its block ids in token order: token i lives in slot
    block_table[i // block_size] * block_size + i % block_size
of the pool. Blocks are handed out lazily, one when a sequence's next token starts a new block,
and all come back the moment it finishes.

There is no preemption yet (a later phase adds it), so nothing may ever run out mid-decode:
admitting a sequence reserves the blocks its worst case (prompt + max_tokens) will need, and
`can_allocate` counts blocks that are free *and* not promised to a running sequence.
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
        self.reserved: dict[int, int] = {}   # seq_id -> blocks promised to it, not yet handed out
        self.num_reserved = 0                # sum of reserved.values()

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)        # ceil division

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    def can_allocate(self, seq: Sequence) -> bool:
        """Would the pool cover this sequence's worst case on top of every promise already made?"""
        return self.blocks_for(seq.max_len) <= len(self.free_ids) - self.num_reserved

    def allocate(self, seq: Sequence) -> None:
        """Blocks for the prompt now; reserve the rest of the worst case for later appends."""
        if seq.block_table or seq.seq_id in self.reserved:
            raise RuntimeError(f"sequence {seq.seq_id} already holds blocks")
        if not self.can_allocate(seq):
            raise RuntimeError(f"sequence {seq.seq_id} does not fit; call can_allocate first")
        seq.block_table = [self.free_ids.popleft() for _ in range(self.blocks_for(seq.num_tokens))]
        self.reserved[seq.seq_id] = self.blocks_for(seq.max_len) - len(seq.block_table)
        self.num_reserved += self.reserved[seq.seq_id]

    def can_append(self, seq: Sequence) -> bool:
        """Is there a slot for the token this decode step writes (position num_tokens - 1)?"""
        return not self._needs_block(seq) or len(self.free_ids) > 0

    def append_slot(self, seq: Sequence) -> None:
        """Make room for position num_tokens - 1: a new block when it starts one."""
        if not self._needs_block(seq):
            return
        if self.reserved.get(seq.seq_id, 0) <= 0:
            raise RuntimeError(f"sequence {seq.seq_id} grew past its reservation (prompt + max_tokens)")
        seq.block_table.append(self.free_ids.popleft())
        self.reserved[seq.seq_id] -= 1
        self.num_reserved -= 1

    def holds(self, seq: Sequence) -> bool:
        """Was this sequence allocated and not yet freed?"""
        return seq.seq_id in self.reserved

    def free(self, seq: Sequence) -> None:
        """Return every block of a finished sequence and drop what was still reserved for it."""
        if seq.seq_id not in self.reserved:
            raise RuntimeError(f"sequence {seq.seq_id} freed twice (or never allocated)")
        self.num_reserved -= self.reserved.pop(seq.seq_id)
        self.free_ids.extend(seq.block_table)
        seq.block_table = []

    def _needs_block(self, seq: Sequence) -> bool:
        # Position num_tokens - 1 is the newest token; its K/V is written by this step. It needs a
        # new block exactly when it is the first token of one (the off-by-one trap lives here).
        return seq.num_tokens > len(seq.block_table) * self.block_size
