"""Prefix caching: a request reads the K/V blocks of the longest prefix an earlier request left
in the radix tree and computes only the rest; nothing about the tokens changes.

One test per rule: only full, written blocks are shared; a fully cached prompt still computes
its last token; ref count 0 is evictable, not free, and counts as capacity; eviction goes leaf
first, least recently used first; preemption (recompute and swap), two requests with one prefix
in one step, and aborts keep the accounting; cache-aware admission with a bound; a hit gives the
miss's greedy tokens on the real model; and with the cache on or off, the previous phase's tokens.
"""
import functools
import importlib

import pytest

from common.sampling import SamplingParams
from tests.reference import real_pool
from tests.suites import chunked_prefill as chunked   # its workload and helpers

PHASE, PREVIOUS = "p12_prefix_caching", "p11_chunked_prefill"
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4      # tiny-llama: K and V x 2 layers x 2 kv heads x head_dim 16 x fp32
BLOCK = 4
scheduler_module = importlib.import_module(f"phases.{PHASE}.scheduler")


def engine(phase: str = PHASE, preset: str = "tiny-llama", **options):
    LLM = importlib.import_module(f"phases.{phase}").LLM
    return LLM(preset, device="cpu", dtype="float32", **(real_pool(phase, preset) | {"block_size": BLOCK} | options))


def greedy(n: int = 8) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def pool(blocks: int) -> dict:
    return {"kv_cache_bytes": blocks * BLOCK * KV_BYTES_PER_TOKEN}


def reference(prompts, params=None, **options) -> list[list[int]]:
    """The previous phase's tokens (no cache)."""
    outs = engine(PREVIOUS, **options).generate(prompts, params or greedy())
    return [o.token_ids for o in outs]


def run(llm, prompt, params=None) -> tuple[list[int], int]:
    """One request alone: its tokens and how many prompt tokens it found cached."""
    rid = llm.add_request(prompt, params or greedy())
    seq, outputs = llm.requests[rid], {}
    while llm.has_unfinished():
        outputs.update(llm.step())
    return outputs[rid].token_ids, seq.num_cached_tokens


def tree_blocks(llm) -> list[int]:
    return llm.scheduler.block_manager.tree.blocks()


def check_idle(llm):
    """Nothing runs; every block is free or cached, each exactly once."""
    bm = llm.scheduler.block_manager
    assert not llm.has_unfinished() and llm.generators == {} and llm.requests == {} and not bm.owners
    assert sorted(list(bm.free_ids) + tree_blocks(llm)) == list(range(bm.num_blocks))
    assert bm.tree.num_evictable == bm.tree.num_nodes and bm.num_free_blocks == bm.num_blocks


PROMPT = list(range(1, 23))          # 22 tokens: 5 full blocks of 4 and 2 tokens in a sixth


# --- the rules ------------------------------------------------------------------------------------
def test_a_block_still_being_filled_is_never_matched():
    """A prompt chunked 6 tokens a step: after its first step only block 0 (tokens 0-3) is full and
    written; block 1 holds 2 of its 4 tokens and is not in the tree. A request with the same
    prompt finds 4 cached tokens then, not 6 or 8."""
    llm = engine(max_num_batched_tokens=12, max_num_seqs=2, max_num_partial_prefills=2)   # chunks of 6
    bm = llm.scheduler.block_manager
    first = llm.add_request(PROMPT, greedy())
    llm.step()
    assert llm.requests[first].num_computed_tokens == 6 and len(tree_blocks(llm)) == 1
    second = llm.add_request(PROMPT, greedy())
    assert [n.block for n in bm.match(llm.requests[second])] == llm.requests[first].block_table[:1]
    outputs = {}
    while llm.has_unfinished():
        outputs.update(llm.step())
    assert [outputs[first].token_ids, outputs[second].token_ids] == reference([PROMPT, PROMPT])
    check_idle(llm)


def test_a_block_planned_but_not_yet_written_is_never_matched():
    """Two requests with one prompt arrive together. The first one's blocks are planned for the
    first step but not written: the tree does not have them. The second, whose next block the
    first is computing, waits that step instead of computing it too; after it, it reads 5 full
    blocks (20 of its 22 tokens) and computes 2."""
    llm = engine()
    bm, plans = llm.scheduler.block_manager, chunked.recorded_plans(llm)
    a, b = llm.add_request(PROMPT, greedy()), llm.add_request(PROMPT, greedy())
    plan, sb = llm.scheduler.schedule(), llm.requests[b]
    assert [s.seq_id for s in plan.seqs] == [a] and bm.match(sb) == [] and not tree_blocks(llm)
    llm._commit(llm.scheduler, plan.seqs, llm.runner.run(plan))      # the step runs: now they are written
    assert len(bm.match(sb)) == 5
    outputs = {}
    while llm.has_unfinished():
        outputs.update(llm.step())
    assert plans[1] == ([a, b], [1, 2]) and sb.num_cached_tokens == 20
    assert [outputs[a].token_ids, outputs[b].token_ids] == reference([PROMPT, PROMPT])
    check_idle(llm)


def test_two_requests_computing_one_prefix_in_one_step_keep_one_copy(monkeypatch):
    """When two requests with one prefix do run in the same step (here the wait above switched
    off; across the pipeline's two micro-batch groups, which schedule apart, it happens), both
    compute it. After the step the second reads the first's blocks and its own copies are free."""
    llm = engine()
    monkeypatch.setattr(llm.scheduler, "_waits_for_prefix", lambda seq, plan: False)
    plans = chunked.recorded_plans(llm)
    a, b = llm.add_request(PROMPT, greedy()), llm.add_request(PROMPT, greedy())
    llm.step()
    assert plans[0] == ([a, b], [22, 22])
    sa, sb = llm.requests[a], llm.requests[b]
    assert sa.num_cached_tokens == sb.num_cached_tokens == 0
    assert sa.block_table[:5] == sb.block_table[:5] and sa.block_table[5] != sb.block_table[5]
    assert sorted(tree_blocks(llm)) == sorted(sa.block_table[:5])
    outputs = {}
    while llm.has_unfinished():
        outputs.update(llm.step())
    assert [outputs[a].token_ids, outputs[b].token_ids] == reference([PROMPT, PROMPT])
    check_idle(llm)


@pytest.mark.timeout(240)
def test_pipeline_groups_computing_one_prefix_give_the_previous_tokens():
    """The pipeline's two micro-batch groups schedule apart over one block manager: prompts with
    one beginning land in both groups and compute it at once; each group's caching keeps one copy
    and the other reads it. The previous phase's tokens."""
    ParallelLLM = importlib.import_module(f"phases.{PHASE}").ParallelLLM
    options = dict(block_size=BLOCK, max_num_batched_tokens=16, max_num_seqs=4, cpu_kv_cache_bytes=1 << 21)
    prompts = [PROMPT + [100 + i] * (i + 1) for i in range(5)]
    with ParallelLLM("tiny-llama", device="cpu", dtype="float32", parallel="pipeline", world_size=2, **options) as llm:
        outs = llm.generate(prompts, greedy(6))
    assert [o.token_ids for o in outs] == reference(prompts, greedy(6), **options)


@pytest.mark.parametrize("length", [16, 18, 4, 1])
def test_a_fully_cached_prompt_still_computes_its_last_token(length):
    """Run a prompt twice. The second time every full block but one holding its last token is
    read from the cache, and at least one token is computed: its logits give the first output.
    16 tokens (block-aligned): 12 cached, 4 computed; 18: 16 cached, 2 computed; 4 or 1: none."""
    prompt = PROMPT[:length]
    llm = engine()
    plans = chunked.recorded_plans(llm)
    cold, cached_cold = run(llm, prompt)
    plans.clear()
    warm, cached_warm = run(llm, prompt)
    expected = {16: 12, 18: 16, 4: 0, 1: 0}[length]
    assert (cached_cold, cached_warm) == (0, expected)
    assert plans[0][1] == [length - expected]
    assert cold == warm == reference([prompt])[0]
    check_idle(llm)


def test_refcount_zero_is_evictable_and_counts_as_capacity():
    """A 12-block pool: a 22-token prompt leaves 5 cached blocks behind (ref 0, not free). A
    request needing 10 blocks still fits: admission counts cached blocks as capacity, and
    evicts as many as it needs. The pinning trap: a hit's unreferenced nodes are capacity only
    until the request that reads them is admitted."""
    llm = engine(**pool(12))
    bm = llm.scheduler.block_manager
    run(llm, PROMPT, greedy(1))
    assert (len(bm.free_ids), bm.tree.num_evictable, bm.num_free_blocks) == (7, 5, 12)
    other = list(range(100, 140))                      # 40 tokens: 10 blocks, shares nothing
    tokens, cached = run(llm, other, greedy(4))
    assert cached == 0 and tokens == reference([other], greedy(4))[0]
    check_idle(llm)
    # pinning: a prompt whose 5-block hit is all ref 0 may not count those 5 as free for its rest
    hit_prompt = PROMPT[:20] + list(range(200, 224))   # 44 tokens: 5 cached blocks + 6 new
    assert bm.reset_cache() > 0
    run(llm, PROMPT, greedy(1))
    seq = llm.requests[llm.add_request(hit_prompt, greedy(1))]
    hit = bm.match(seq)
    assert len(hit) == 5 and bm.num_free_blocks == 12
    assert bm.can_allocate(7, hit) and not bm.can_allocate(8, hit)


def test_eviction_is_leaf_first_and_least_recently_used_first():
    """Prompts A, B share 2 blocks and branch; C shares nothing. Used in the order A, C, B: the
    first blocks evicted are A's branch leaf-first (last block first), then C's, while the shared
    prefix (an inner node while B's branch lives) goes only after B's branch: a node is never
    removed while a node below it is in the tree. (B read the shared blocks last.)"""
    llm = engine()
    tree = llm.scheduler.block_manager.tree
    a = list(range(1, 17))                             # blocks a0 a1 a2 a3
    b = a[:8] + list(range(50, 58)) + [9]              # a0 a1 b2 b3 (+1 token: its last block is full)
    c = list(range(80, 93))                            # c0 c1 c2
    for prompt in (a, c, b):
        run(llm, prompt, greedy(1))
    blocks = {n.key: n.block for n in _nodes(tree)}

    def block(tokens, i):
        return blocks[tuple(tokens[i * BLOCK:(i + 1) * BLOCK])]
    order = tree.evict(tree.num_nodes)
    assert order == [block(a, 3), block(a, 2), block(c, 2), block(c, 1), block(c, 0), block(b, 3), block(b, 2),
                     block(a, 1), block(a, 0)]
    assert tree.num_nodes == 0 and tree.num_evictable == 0 and not tree.leaves


def _nodes(tree):
    out, stack = [], list(tree.root.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack += node.children.values()
    return out
# --- preemption, aborts, admission ----------------------------------------------------------------
def preempted_run(preemption: str):
    """preempt_mid_prefill's setting (tests/suites/chunked_prefill.py): a long prompt chunked beside a
    decode in an 11-block pool is preempted between two chunks, then resumed."""
    llm = engine(max_num_batched_tokens=8, max_num_seqs=4, preemption=preemption, **pool(11))
    plans, seen = chunked.recorded_plans(llm), []
    preempt = llm.scheduler._preempt
    llm.scheduler._preempt = lambda seq, plan: seen.append(seq.seq_id) or preempt(seq, plan)
    prompts, params = [[1, 2, 3], list(range(1, 41))], [greedy(20), greedy(4)]
    outs = llm.generate(prompts, params, priorities=[0, 1])
    check_idle(llm)
    assert seen and [o.token_ids for o in outs] == reference(prompts, params)
    return llm, plans, seen


def test_recomputed_request_reads_its_own_cached_blocks():
    """Preempted by recompute after 33 of its 40 tokens: its 8 full written blocks stay cached
    (ref 0). The decode beside it evicts what it needs, leaves first (the end of the prompt);
    when the preempted request comes back it reads the blocks left and computes only the rest,
    where the previous phase computes all 40 again."""
    llm, plans, seen = preempted_run("recompute")
    long_id = seen[0]
    prefilled = sum(n[ids.index(long_id)] for ids, n in plans if long_id in ids) - 3   # 3 decodes
    hit = llm.scheduler.cache_hits                     # its second admission's; the others hit nothing
    assert hit > 0 and hit % BLOCK == 0 and prefilled == 33 + 40 - hit


def test_swapped_request_resumes_with_the_cache_on():
    """Swap keeps working: its blocks (its cached ones among them) are copied out, come back into
    new blocks of its own, and the next step's caching finds them in the tree already: the copies
    are freed and it reads the tree's blocks again."""
    llm, plans, seen = preempted_run("swap")
    long_id = seen[0]
    assert sum(n[ids.index(long_id)] for ids, n in plans if long_id in ids) - 3 == 40


def test_aborted_request_returns_its_written_blocks_to_the_tree():
    """Aborted mid-decode: its full written blocks stay cached (ref 0) and the next request with
    its prompt reads them; its block still being filled goes back to the free list."""
    llm = engine()
    bm = llm.scheduler.block_manager
    rid = llm.add_request(PROMPT, greedy(10))
    for _ in range(4):                                  # prefill, then 3 decodes: 25 tokens written
        llm.step()
    seq = llm.requests[rid]
    assert seq.num_computed_tokens == 25 and len(bm.owners[rid]) == 6
    own = seq.block_table[6:]
    llm.abort_request(rid)
    assert set(own) <= set(bm.free_ids) and bm.tree.num_nodes == bm.tree.num_evictable == 6
    check_idle(llm)
    again = PROMPT + seq.output_ids[:3]                 # 25 tokens: 6 full blocks before its last one
    tokens, cached = run(llm, again)
    assert cached == 6 * BLOCK and tokens == reference([again])[0]


def test_cache_aware_admission_prefers_hits_but_never_starves_a_miss():
    """One seat: a miss queued first, then many requests whose prompt is cached. The hits go
    first, but the miss is admitted after MAX_OVERTAKES of them at most."""
    llm = engine(max_num_seqs=1)
    run(llm, PROMPT, greedy(1))
    admitted, admit = [], llm.scheduler._admit

    def recording(seq, plan):
        ok = admit(seq, plan)
        admitted.extend([seq.seq_id] if ok else [])
        return ok
    llm.scheduler._admit = recording
    miss = llm.add_request(list(range(300, 322)), greedy(1))
    hits = [llm.add_request(PROMPT[:20] + [i], greedy(1)) for i in range(scheduler_module.MAX_OVERTAKES + 5)]
    while llm.has_unfinished():
        llm.step()
    assert admitted[0] == hits[0]                      # a hit overtook the miss
    assert admitted.index(miss) == scheduler_module.MAX_OVERTAKES
    assert admitted == hits[:scheduler_module.MAX_OVERTAKES] + [miss] + hits[scheduler_module.MAX_OVERTAKES:]
    check_idle(llm)


# --- same tokens: the real model, and the previous phase with the cache on and off ------------------
def test_real_model_hit_gives_the_miss_tokens(real_prompts, hf_reference):
    """SmolLM2, greedy: every prompt run cold, then again after all of them (each now reads its
    own cached prefix, and the chat prompts the shared system prompt): the same tokens, HF's.
    Eight tokens each (HF's first 8): every one of them attends over the cached prefix."""
    llm = engine(preset="smollm2-135m", block_size=16)
    cold = [o.token_ids for o in llm.generate(real_prompts, greedy(8))]
    hits = llm.scheduler.cache_hits
    warm = [o.token_ids for o in llm.generate(real_prompts, greedy(8))]
    assert llm.scheduler.cache_hits - hits > 0.9 * sum(len(p) - 16 for p in real_prompts)
    assert warm == cold == [ref[:8] for ref in hf_reference("smollm2-135m")]


def shared_prefix_workload():
    """mixed_workload (tests/suites/chunked_prefill.py): staggered, sampled and greedy, priorities; every
    other prompt now starts with one of two shared 'system prompts' (9 and 21 tokens)."""
    systems = [list(range(500, 509)), list(range(600, 621))]
    return [(arrival, systems[i % 4 // 2] + prompt if i % 2 else prompt, params, priority)
            for i, (arrival, prompt, params, priority) in enumerate(chunked.mixed_workload())]


def staggered_options(preemption: str) -> dict:
    return dict(kv_cache_bytes=36 * BLOCK * KV_BYTES_PER_TOKEN, preemption=preemption, max_num_seqs=16)


@functools.cache
def previous_phase_tokens(preemption: str) -> list[list[int]]:
    """The previous phase's tokens for shared_prefix_workload: once per preemption mode."""
    return chunked.run_arrivals(engine(PREVIOUS, **staggered_options(preemption)), shared_prefix_workload())


# cache off with recompute is test_cache_off_is_the_previous_phase_step_for_step's workload and
# pool (its plans equal the previous phase's step for step): `make test-all` runs it here too
@pytest.mark.parametrize(("cache", "preemption"), [(True, "recompute"), (True, "swap"), (False, "swap"),
                                                   pytest.param(False, "recompute", marks=pytest.mark.slow)])
def test_staggered_shared_prefixes_equal_previous_phase(cache, preemption):
    """A pool that forces preemptions, shared prefixes: with the cache on (hits, evictions) or off,
    the previous phase's tokens."""
    requests = shared_prefix_workload()
    llm = engine(max_num_batched_tokens=17, enable_prefix_caching=cache, **staggered_options(preemption))
    tokens = chunked.run_arrivals(llm, requests)
    assert llm.scheduler.num_preemptions > 0
    assert (llm.scheduler.cache_hits > 0) == cache
    assert tokens == previous_phase_tokens(preemption)


def test_cache_off_is_the_previous_phase_step_for_step():
    """enable_prefix_caching=False: the previous phase's plans, step for step, and nothing cached."""
    requests = shared_prefix_workload()
    options = dict(max_num_batched_tokens=17, max_num_seqs=16, **pool(36))
    off, previous = engine(enable_prefix_caching=False, **options), engine(PREVIOUS, **options)
    plans = [chunked.recorded_plans(llm) for llm in (off, previous)]
    assert chunked.run_arrivals(off, requests) == chunked.run_arrivals(previous, requests)
    assert plans[0] == plans[1] and off.scheduler.block_manager.tree.num_nodes == 0


@pytest.mark.parametrize("value", [2, "yes", None])
def test_bad_prefix_caching_option(value):
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        engine(enable_prefix_caching=value)
