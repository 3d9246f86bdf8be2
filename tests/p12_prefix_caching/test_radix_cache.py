"""The prefix cache's block accounting, torch-free: a property test of random operations and the
tree's own rules.

After every operation every block of the pool is exactly one of free, cached (a tree node nobody
reads) or referenced (a tree node with readers, or a sequence's own block), and the tree's
counters agree with a recount. A simulated pool records which tokens each block holds: a tree
node's block always holds its key's tokens, and nothing ever writes into a tree node's block.
"""
import importlib
import random

import pytest

from common.sampling import SamplingParams

PHASE = "p12_prefix_caching"
BlockManager = importlib.import_module(f"phases.{PHASE}.block_manager").BlockManager
RadixCache = importlib.import_module(f"phases.{PHASE}.radix_cache").RadixCache
Sequence = importlib.import_module(f"phases.{PHASE}.sequence").Sequence
BLOCK = 4


def make_seq(seq_id: int, prompt: list[int]) -> Sequence:
    return Sequence(seq_id, prompt, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True), 0.0)


def tree_nodes(tree) -> list:
    out, stack = [], list(tree.root.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack += node.children.values()
    return out


def check_accounting(bm: BlockManager, seqs: list[Sequence], pool: dict[int, list]) -> None:
    """Every block free, cached or referenced, exactly once; the tree's counters, ref counts,
    leaves and paths as a recount finds them; every node's block holds its key's tokens."""
    nodes = tree_nodes(bm.tree)
    held = [s for s in seqs if bm.holds(s)]
    own = [b for s in held for b in s.block_table[len(bm.owners[s.seq_id]):]]
    every = list(bm.free_ids) + [n.block for n in nodes] + own
    assert sorted(every) == list(range(bm.num_blocks)), "a block is lost or in two places"
    readers = {id(n): 0 for n in nodes}
    for s in held:
        path = bm.owners[s.seq_id]
        assert [n.block for n in path] == s.block_table[:len(path)]
        for i, n in enumerate(path):                 # a path from the root, spelling s's tokens
            assert n.parent is (path[i - 1] if i else bm.tree.root)
            assert n.key == tuple(s.token_ids_from(0)[i * BLOCK:(i + 1) * BLOCK])
            readers[id(n)] += 1
    for n in nodes:
        assert n.ref == readers[id(n)], "a ref count is not the number of sequences reading the node"
        assert n.parent is bm.tree.root or n.parent.ref >= n.ref
        assert pool[n.block] == list(n.key), "a tree node's block does not hold its tokens"
    assert bm.tree.num_nodes == len(nodes)
    assert bm.tree.num_evictable == sum(n.ref == 0 for n in nodes)
    assert bm.tree.leaves == {n for n in nodes if n.ref == 0 and not n.children}
    assert bm.num_free_blocks == len(bm.free_ids) + bm.tree.num_evictable


class Model:
    """Drives a BlockManager the way the scheduler and engine do, with a simulated pool."""

    def __init__(self, rng: random.Random, num_blocks: int = 48):
        self.rng, self.bm = rng, BlockManager(num_blocks, BLOCK)
        self.pool = {b: [] for b in range(num_blocks)}     # block -> the tokens written into it
        self.seqs, self.ids, self.hits = [], 0, 0
        self.prefixes = [[rng.randrange(50) for _ in range(rng.randint(1, 24))] for _ in range(4)]

    def tree_blocks(self) -> set[int]:
        return {n.block for n in tree_nodes(self.bm.tree)}

    def new(self) -> None:
        """A prompt that starts with one of a few shared prefixes arrives."""
        prompt = self.rng.choice(self.prefixes) + [self.rng.randrange(50) for _ in range(self.rng.randint(0, 9))]
        self.admit(make_seq(self.ids, prompt))
        self.ids += 1

    def admit(self, seq: Sequence) -> None:
        """As the scheduler admits: its cached prefix (never its last token), blocks for a chunk
        of the rest, then the step that writes the chunk."""
        hit = self.bm.match(seq)
        cached = len(hit) * BLOCK
        assert cached < seq.num_tokens, "a fully cached prompt must compute its last token"
        chunk = self.rng.randint(1, seq.num_tokens - cached)
        blocks = self.bm.blocks_for(cached + chunk) - len(hit)
        if self.bm.can_allocate(blocks, hit):
            self.bm.allocate(seq, blocks, hit)
            self.hits += bool(hit)
            seq.num_computed_tokens = cached
            self.write(seq, chunk)
            self.seqs.append(seq)

    def write(self, seq: Sequence, n: int) -> None:
        """A step computes seq's next n tokens (its blocks already cover them), then caches."""
        start, tokens = seq.num_computed_tokens, seq.token_ids_from(0)
        protected = self.tree_blocks()
        for pos in range(start, start + n):
            block = seq.block_table[pos // BLOCK]
            assert block not in protected, "a step writes into a shared (cached) block"
            self.pool[block] = self.pool[block][:pos % BLOCK] + [tokens[pos]]
        seq.num_computed_tokens += n
        self.bm.cache(seq)

    def step(self) -> None:
        """A running sequence computes the rest of its prompt (a chunk) or decodes one token."""
        seq = self.rng.choice(self.seqs)
        if seq.num_pending_tokens == 0:
            seq.output_ids.append(self.rng.randrange(50))
        n = self.rng.randint(1, seq.num_pending_tokens)
        if self.bm.can_grow(seq, seq.num_computed_tokens + n):
            self.bm.grow(seq, seq.num_computed_tokens + n)
            self.write(seq, n)

    def release(self, how: str) -> None:
        """finish / abort / preempt by recompute (free, wait again) / preempt by swap (free, come
        back later with as many new blocks, its K/V copied into them)."""
        seq = self.rng.choice(self.seqs)
        saved = [list(self.pool[b]) for b in self.bm.free(seq)]
        self.seqs.remove(seq)
        if how == "swap" and self.bm.can_allocate(len(saved)):
            self.bm.allocate(seq, len(saved))
            for block, tokens in zip(seq.block_table, saved):
                self.pool[block] = tokens
            self.bm.cache(seq)
            self.seqs.append(seq)
        elif how == "recompute":
            seq.num_computed_tokens = 0
            self.admit(seq)

    def evict(self) -> None:
        self.bm.free_ids.extend(self.bm.tree.evict(self.rng.randint(1, 6)))

    def match(self) -> None:
        seq = make_seq(-1, self.rng.choice(self.prefixes) + [self.rng.randrange(50)])
        hit = self.bm.match(seq)
        assert all(n.key == tuple(seq.prompt_ids[i * BLOCK:(i + 1) * BLOCK]) for i, n in enumerate(hit))


OPERATIONS = ["new", "new", "step", "step", "step", "finish", "abort", "recompute", "swap", "evict", "match"]


@pytest.mark.parametrize("seed", range(5))
def test_random_operations_keep_every_block_in_exactly_one_place(seed):
    """5 seeds x 2,500 operations = 12,500 random operations, the accounting checked after each."""
    rng = random.Random(seed)
    model = Model(rng)
    counts = dict.fromkeys(OPERATIONS, 0)
    for _ in range(2500):
        op = rng.choice(OPERATIONS)
        if op in ("step", "finish", "abort", "recompute", "swap") and not model.seqs:
            op = "new"
        getattr(model, op)() if op in ("new", "step", "evict", "match") else model.release(op)
        counts[op] += 1
        check_accounting(model.bm, model.seqs, model.pool)
    for seq in list(model.seqs):
        model.bm.free(seq)
    model.seqs.clear()
    check_accounting(model.bm, [], model.pool)
    assert model.bm.num_free_blocks == model.bm.num_blocks
    model.bm.reset_cache()
    assert len(model.bm.free_ids) == model.bm.num_blocks and model.bm.tree.num_nodes == 0
    assert all(n > 100 for n in counts.values()), counts
    assert model.hits > 100, "the operations never found a cached prefix"
