"""BlockManager: hands out fixed-size KV blocks, and keeps the written ones as a prefix cache (torch-free).

The KV pool is cut into `num_blocks` blocks of `block_size` token slots. A sequence owns a block
table, the list of its block ids in token order: token i lives in slot
    block_table[i // block_size] * block_size + i % block_size
of the pool. Blocks are allocated as sequences grow: on admission, blocks for a prompt's first
chunk; then more each time its next chunk or token passes the end of its last block. Nothing is
reserved for a sequence's worst case (prompt + max_tokens), so more sequences fit at once than
under reservation, and the pool can run out mid-step: the scheduler then preempts one
(scheduler.py).

Prefix caching: every block is exactly one of
  free        in free_ids, holds nothing anyone will read;
  cached      a node of the radix tree (radix_cache.py) that no running sequence reads (ref 0):
              its K/V stays until the pool needs the block, then the LRU leaf goes first;
  referenced  read by running sequences: a tree node with ref > 0 (full, written, shared
              read-only), or a sequence's own block (not yet full, or not yet written).
A sequence's table starts with the tree nodes of its cached prefix, `owners[seq_id]`, and ends
with its own blocks. After every step, cache() moves its newly written full blocks into the tree;
when it finishes, its own blocks go back to free_ids and its nodes stay cached.
"""
from __future__ import annotations

from collections import deque

from .radix_cache import Node, RadixCache
from .sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"need positive num_blocks and block_size, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_ids: deque[int] = deque(range(num_blocks))   # FIFO: a freed block is reused last
        self.tree = RadixCache(block_size, enabled=enable_prefix_caching)
        self.owners: dict[int, list[Node]] = {}   # seq_id -> the tree nodes it reads: block_table[:len(nodes)]

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)        # ceil division

    @property
    def num_free_blocks(self) -> int:
        """Blocks a new request can have: free ones, and cached ones nobody reads (evicted on demand)."""
        return len(self.free_ids) + self.tree.num_evictable

    def match(self, seq: Sequence) -> list[Node]:
        """Tree nodes of the longest cached prefix of seq's tokens, in full blocks, never its last
        token: a step must compute at least one token to have logits to sample from."""
        if not self.tree.enabled:
            return []
        return self.tree.match(seq.block_keys(self.block_size)[:(seq.num_tokens - 1) // self.block_size])

    def can_allocate(self, num_blocks: int, hit: list[Node] = ()) -> bool:
        # A node of `hit` nobody reads yet counts as evictable now, but admitting the sequence pins
        # it: it cannot also be evicted to make one of the num_blocks new blocks.
        return num_blocks <= self.num_free_blocks - sum(node.ref == 0 for node in hit)

    def allocate(self, seq: Sequence, num_blocks: int, hit: list[Node] = ()) -> None:
        """Give a sequence that holds nothing the blocks of its cached prefix `hit` (shared,
        read-only) and `num_blocks` new ones: for the tokens a prefill writes, or for the K/V a
        swapped-out sequence brings back."""
        if self.holds(seq):
            raise RuntimeError(f"sequence {seq.seq_id} already holds blocks")
        if not self.can_allocate(num_blocks, hit):
            raise RuntimeError(f"sequence {seq.seq_id} does not fit; call can_allocate first")
        self.tree.acquire(hit)                       # first: pinned, so _take cannot evict them
        self.owners[seq.seq_id] = list(hit)
        seq.block_table = [node.block for node in hit] + self._take(num_blocks)

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Are there blocks for the sequence's first num_tokens positions (a decode's next token,
        or a prompt's next chunk)?"""
        return self._blocks_short(seq, num_tokens) <= self.num_free_blocks

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Extend the block table to cover positions [0, num_tokens)."""
        seq.block_table += self._take(self._blocks_short(seq, num_tokens))

    def cache(self, seq: Sequence) -> None:
        """After a step wrote seq's K/V: each full block of its computed tokens joins the tree.
        Only then, never at allocation: a block still being filled, or planned but not yet
        written, must not be found by another request. Where another sequence cached the same
        tokens first (two requests with one prefix admitted in one step), seq reads that block
        and its own copy is free again."""
        nodes = self.owners[seq.seq_id]
        keys = seq.block_keys(self.block_size)[:seq.num_computed_tokens // self.block_size]
        for i in range(len(nodes), len(keys) if self.tree.enabled else 0):
            node = self.tree.insert(nodes[-1] if nodes else self.tree.root, keys[i], seq.block_table[i])
            if node.block != seq.block_table[i]:
                self.free_ids.append(seq.block_table[i])
                seq.block_table[i] = node.block
            nodes.append(node)

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Roll back to positions [0, num_tokens): the blocks that begin at or past num_tokens go
        back to the pool (a verify step grew them for drafts it rejected). A block that still
        holds a kept position stays, its slots past num_tokens left to be overwritten."""
        keep = max(self.blocks_for(num_tokens), len(self.owners[seq.seq_id]))   # never a cached block
        self.free_ids.extend(seq.block_table[keep:])
        del seq.block_table[keep:]

    def holds(self, seq: Sequence) -> bool:
        return seq.seq_id in self.owners

    def free(self, seq: Sequence) -> list[int]:
        """Give back every block of a sequence: its own ones to the pool, its tree nodes to the
        cache (read by one sequence fewer). Returns the ids it held, in token order."""
        if seq.seq_id not in self.owners:
            raise RuntimeError(f"sequence {seq.seq_id} freed twice (or never allocated)")
        nodes = self.owners.pop(seq.seq_id)
        blocks, seq.block_table = seq.block_table, []
        self.tree.release(nodes)
        self.free_ids.extend(blocks[len(nodes):])
        return blocks

    def reset_cache(self) -> int:
        """Evict every cached block nobody reads (a benchmark's cold start); how many."""
        freed = self.tree.evict(self.tree.num_evictable)
        self.free_ids.extend(freed)
        return len(freed)

    def check(self, holders: list[Sequence]) -> None:
        """Raise AssertionError unless every block is exactly one of: free, a tree node, or the own
        block of one of `holders` (the sequences that hold blocks); each holder's table starts with
        its path of nodes; and each node's ref counts the holders that read it (radix_cache.py
        checks its counts and leaves). Tests call it after every call."""
        assert set(self.owners) == {seq.seq_id for seq in holders}, "the owners are not the holding sequences"
        readers, own = {}, []
        for seq in holders:
            nodes = self.owners[seq.seq_id]
            assert [node.block for node in nodes] == seq.block_table[:len(nodes)], f"{seq.seq_id}: table != nodes"
            assert all(node.parent is up for node, up in zip(nodes, [self.tree.root, *nodes])), "not a path"
            for node in nodes:
                readers[node] = readers.get(node, 0) + 1
            own += seq.block_table[len(nodes):]
        blocks = sorted([*self.free_ids, *self.tree.check(readers), *own])
        assert blocks == list(range(self.num_blocks)), "a block is lost, or in two places"

    def rebuild(self) -> None:
        """The accounting built anew after a failure (an error, a Ctrl-C) cut an update of it in
        half, once every request was aborted (nobody reads a block): from the tree's links alone,
        which no statement leaves half changed (a node joins its parent in one assignment, only
        once its block is written, and leaves in one del). Cached blocks stay cached."""
        self.owners = {}
        cached = set(self.tree.rebuild())
        self.free_ids = deque(block for block in range(self.num_blocks) if block not in cached)

    def _take(self, num_blocks: int) -> list[int]:
        """num_blocks block ids off the free list, evicting cached blocks when it runs short."""
        if num_blocks > len(self.free_ids):
            self.free_ids.extend(self.tree.evict(num_blocks - len(self.free_ids)))
        return [self.free_ids.popleft() for _ in range(num_blocks)]

    def _blocks_short(self, seq: Sequence, num_tokens: int) -> int:
        # Position num_tokens - 1 is the last one the step writes: a new block is needed exactly
        # when it lies past the table's last block (the off-by-one trap lives here).
        return max(0, self.blocks_for(num_tokens) - len(seq.block_table))
