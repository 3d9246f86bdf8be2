"""RadixCache: KV blocks kept after their request, in a tree over token ids (torch-free).

A node is one full block of KV: its key is the block's block_size token ids, its value the pool
block that holds their K/V, and its parent the block before it. So the path from the root to a
node spells a prefix of token ids, and every request that starts with that prefix can read these
blocks instead of computing them again (SGLang's RadixAttention; SGLang also merges a chain of
only children into one node, which changes nothing of what is shared).

  root ─ [sys 0..15] ─ [sys 16..31] ─ [user A 32..47]       a key is one block of token ids,
                                   └─ [user B 32..47]       children are found by their key

A node's `ref` counts the running sequences that read it. A sequence holds a whole path from the
root, so a parent's ref is never below its children's, and a node with ref 0 has only ref-0
nodes below it. Ref 0 means *evictable*, not free: the block keeps its K/V and is found by the
next request that starts with its tokens, until the pool needs it. Then the least recently used
leaf with ref 0 goes first; evicting it may make its parent such a leaf. Leaves only: a node is
never removed while a node below it still points into the tree (its block would be freed under
a path that still leads to it).

`enabled=False` keeps the same interface and caches nothing: a user switch, as vLLM's
`enable_prefix_caching`, and the baseline that p12's benchmarks measure the cache against.
"""
from __future__ import annotations

import heapq
import itertools


class Node:
    __slots__ = ("key", "block", "parent", "children", "ref", "last_access", "id")
    _ids = itertools.count()

    def __init__(self, key: tuple[int, ...], block: int, parent: Node | None):
        self.key, self.block, self.parent = key, block, parent
        self.children: dict[tuple[int, ...], Node] = {}
        self.ref = 0
        self.last_access = 0
        self.id = next(Node._ids)        # breaks ties between leaves used at the same time


class RadixCache:
    def __init__(self, block_size: int, enabled: bool = True):
        self.block_size, self.enabled = block_size, enabled
        self.root = Node((), -1, None)
        self.num_nodes = 0               # blocks in the tree, referenced or not
        self.num_evictable = 0           # of those, blocks with ref 0
        self.leaves: set[Node] = set()   # evictable leaves: ref 0 and no children
        self.clock = 0                   # logical time for LRU: one tick per acquire or release

    def match(self, keys: list[tuple[int, ...]]) -> list[Node]:
        """The nodes of the longest cached prefix of these block keys (nothing changes)."""
        node, path = self.root, []
        for key in keys if self.enabled else ():
            node = node.children.get(key)
            if node is None:
                break
            path.append(node)
        return path

    def acquire(self, nodes: list[Node]) -> None:
        """A sequence starts reading these nodes (a path from the root)."""
        self.clock += 1
        for node in nodes:
            if node.ref == 0:
                self.num_evictable -= 1
                self.leaves.discard(node)
            node.ref += 1
            node.last_access = self.clock

    def release(self, nodes: list[Node]) -> None:
        """A sequence stops reading these nodes: at ref 0 they stay cached, evictable."""
        self.clock += 1
        for node in nodes:
            node.ref -= 1
            node.last_access = self.clock
            if node.ref == 0:
                self.num_evictable += 1
                if not node.children:
                    self.leaves.add(node)

    def insert(self, parent: Node, key: tuple[int, ...], block: int) -> Node:
        """The child of `parent` (the root, or a node the caller holds) with this key, acquired
        for the caller: the one already cached (its block replaces the caller's copy), or a new
        node holding `block`."""
        node = parent.children.get(key)
        if node is None:
            node = parent.children[key] = Node(key, block, parent)
            self.num_nodes += 1
            self.num_evictable += 1                # unreferenced until acquire() below
        self.acquire([node])
        return node

    def evict(self, num_blocks: int) -> list[int]:
        """Remove up to num_blocks unreferenced nodes, least recently used leaves first; their
        block ids, now free."""
        heap = [(n.last_access, n.id, n) for n in self.leaves]
        heapq.heapify(heap)
        freed = []
        while heap and len(freed) < num_blocks:
            _, _, node = heapq.heappop(heap)
            freed.append(self._remove(node))
            parent = node.parent
            if parent is not self.root and parent.ref == 0 and not parent.children:
                self.leaves.add(parent)            # its last child went: it is a leaf now
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed

    def _remove(self, node: Node) -> int:
        del node.parent.children[node.key]
        self.leaves.discard(node)
        self.num_nodes -= 1
        self.num_evictable -= 1
        return node.block

    def nodes(self) -> list[Node]:
        """Every node of the tree (root excluded)."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack += node.children.values()
        return out

    def blocks(self) -> list[int]:
        """Every block in the tree (for checks: each is in exactly one node)."""
        return [node.block for node in self.nodes()]

    def check(self, readers: dict[Node, int]) -> list[int]:
        """Raise AssertionError unless each node's ref is its readers' count (node -> sequences
        reading it), no parent has fewer than a child, and the counts and the leaf set are true;
        return the tree's blocks."""
        nodes = self.nodes()
        assert set(readers) <= set(nodes), "a sequence reads a node that left the tree"
        for node in nodes:
            assert node.ref == readers.get(node, 0), f"node {node.id}: ref {node.ref}, read by {readers.get(node, 0)}"
            assert node.parent is self.root or node.parent.ref >= node.ref, "a parent has fewer refs than a child"
        assert self.num_nodes == len(nodes), f"num_nodes {self.num_nodes}, tree has {len(nodes)}"
        assert self.num_evictable == sum(node.ref == 0 for node in nodes), "num_evictable is wrong"
        assert self.leaves == {node for node in nodes if node.ref == 0 and not node.children}, "leaf set is wrong"
        return [node.block for node in nodes]

    def rebuild(self) -> list[int]:
        """Nobody reads any node: every ref 0, the counts and the leaf set recounted from the
        links (see BlockManager.rebuild); the tree's blocks."""
        nodes = self.nodes()
        for node in nodes:
            node.ref = 0
        self.num_nodes = self.num_evictable = len(nodes)
        self.leaves = {node for node in nodes if not node.children}
        return [node.block for node in nodes]
