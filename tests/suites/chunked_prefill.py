"""Chunked prefill: a prompt longer than what a step's budget has left is prefilled over several
steps, beside the decodes, and nothing about the tokens changes.

HF's greedy tokens on tiny-llama at a budget of one block, and on the real model for budgets 1,
7, the block size, the block size + 1 and one larger than every prompt; a last chunk of one
token; chunk boundaries on block boundaries; a chunk reads exactly the keys before its own end,
never a slot not yet written; a partly prefilled request preempted (recompute and swap) and
resumed, or aborted, gives its blocks back.
"""
import importlib
import random

import pytest
import torch

from common.sampling import SamplingParams
from tests.reference import real_pool

KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4      # tiny-llama: K and V x 2 layers x 2 kv heads x head_dim 16 x fp32
BLOCK = 4
NEW_TOKENS = 8
# tiny-llama's pool where a test sets none: 8192 tokens, room for every prompt here. Its default
# (max_num_seqs x max_model_len, 256 MiB) is zeroed at each build, a quarter of a second an engine.
TINY_POOL = {"cpu_kv_cache_bytes": 4 << 20}


@pytest.fixture(scope="module")
def backends(phase):
    return importlib.import_module(f"phases.{phase}.attention_backends")


def engine(phase: str, preset: str = "tiny-llama", **options):
    LLM = importlib.import_module(f"phases.{phase}").LLM
    pool = TINY_POOL if preset == "tiny-llama" else real_pool(phase, preset)
    return LLM(preset, device="cpu", dtype="float32", **pool | options)


@pytest.fixture(scope="module")
def before(previous):
    """The previous phase's engine, whose tokens the tests below are held to (one for the module:
    each of them only generates on it, and generate() leaves it idle)."""
    return engine(previous, block_size=BLOCK)


def greedy(n: int = NEW_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def check_idle(llm):
    bm = llm.scheduler.block_manager
    assert not llm.has_unfinished() and llm.generators == {} and llm.requests == {}
    assert bm.num_free_blocks == bm.num_blocks and not bm.owners


def recorded_plans(llm) -> list:
    """Every plan the engine's scheduler returns from now on, as (seq ids, new tokens each)."""
    plans, schedule = [], llm.scheduler.schedule

    def recording():
        plan = schedule()
        plans.append(([s.seq_id for s in plan.seqs], list(plan.num_new_tokens)))
        return plan
    llm.scheduler.schedule = recording
    return plans


# --- HF's greedy tokens for every budget ---------------------------------------------------------
def check_budget_keeps_hfs_tokens(phase: str, preset: str, budget: int, hf_prefix):
    """The preset's reference prompts in one batch under a budget of `budget` tokens a step (the
    preset's block size: 16): HF's tokens; every step within the budget; every prompt longer
    than the budget chunked, and some prompt chunked exactly when the budget is below them all.
    Budgets of 7 and less leave out prompts of 100 tokens and more (as many steps as tokens)."""
    reference_prompts, expected_tokens = hf_prefix(preset, NEW_TOKENS)
    prompts = [p for p in reference_prompts if budget > 7 or len(p) < 100]
    llm = engine(phase, preset, max_num_batched_tokens=budget, max_num_seqs=min(budget, 8))
    plans = recorded_plans(llm)
    outs = llm.generate(prompts, greedy())
    assert [o.token_ids for o in outs] == [t for p, t in zip(reference_prompts, expected_tokens) if p in prompts]
    assert all(sum(n) <= budget for _, n in plans)
    first = {}                                           # seq id -> the tokens of its first step
    for ids, n in plans:
        for seq_id, k in zip(ids, n):
            first.setdefault(seq_id, k)
    chunked = [first[i] < len(p) for i, p in zip(sorted(first), prompts)]
    assert all(c for c, p in zip(chunked, prompts) if len(p) > budget)    # (a shorter one may be too:
    assert any(chunked) == (budget < sum(map(len, prompts)))              # the step's budget is shared)
    check_idle(llm)


def test_tiny_model_tokens_are_hfs(phase, hf_prefix):
    """tiny-llama's reference prompts (9, 32, 32 and 600 random ids) at a budget of one block (16):
    the longer three chunked, the 600-token one beside the others' decodes. The real model's twin
    below runs in `make test-all`."""
    check_budget_keeps_hfs_tokens(phase, "tiny-llama", 16, hf_prefix)


@pytest.mark.slow
@pytest.mark.parametrize("budget", [1, 7, 16, 17, 4096])
def test_real_model_tokens_are_hfs(phase, budget, hf_prefix):
    """SmolLM2's reference set: budgets 16 and 17 put chunk ends on and just past block
    boundaries; 4096 holds every prompt whole; 1 and 7 run one or a few tokens per step, one to
    seven sequences at a time, on the prompts under 100 tokens (the 518-token one: 16 and 17).
    Marked slow (a real prefill is seconds on a CPU): `make test` runs tiny-llama's reference set
    at 16 above, the tiny model's tests below put chunk ends past block boundaries and run
    1-token chunks, and the correctness suite holds every phase to HF's tokens on the real model."""
    check_budget_keeps_hfs_tokens(phase, "smollm2-135m", budget, hf_prefix)


# --- chunk boundaries ---------------------------------------------------------------------------
def prefill_chunks(phase: str, budget: int, prompt_len: int, **options) -> tuple[list[int], list[int], object]:
    """One greedy request alone: its chunks (new tokens per step until its first output), its
    tokens, and the engine."""
    llm = engine(phase, block_size=BLOCK, max_num_batched_tokens=budget, max_num_seqs=1, **options)
    plans = recorded_plans(llm)
    [out] = llm.generate([list(range(1, prompt_len + 1))], greedy())
    chunks = [n for _, [n] in plans][:len(plans) - NEW_TOKENS + 1]
    check_idle(llm)
    return chunks, out.token_ids, llm


def previous_phase_tokens(before, prompt_len: int) -> list[int]:
    return before.generate([list(range(1, prompt_len + 1))], greedy())[0].token_ids


def test_last_chunk_of_one_token(phase, before):
    chunks, tokens, _ = prefill_chunks(phase, budget=8, prompt_len=17)
    assert chunks == [8, 8, 1]
    assert tokens == previous_phase_tokens(before, 17)


def test_chunk_boundaries_on_block_boundaries(phase, before):
    """A budget of two blocks: every chunk starts a block and fills two; the block table grows by
    exactly two blocks per chunk."""
    llm = engine(phase, block_size=BLOCK, max_num_batched_tokens=2 * BLOCK, max_num_seqs=1)
    request = llm.add_request(list(range(1, 3 * 2 * BLOCK + 1)), greedy())
    outputs = {}
    for chunk in range(1, 4):
        outputs.update(llm.step())
        [seq] = llm.scheduler.running
        assert seq.num_computed_tokens == chunk * 2 * BLOCK and len(seq.block_table) == 2 * chunk
        assert bool(seq.output_ids) == (chunk == 3)       # only the last chunk samples
    while llm.has_unfinished():
        outputs.update(llm.step())
    check_idle(llm)
    assert outputs[request].token_ids == previous_phase_tokens(before, 3 * 2 * BLOCK)


def test_a_prompt_longer_than_the_budget_is_accepted(phase, before):
    """The previous phase refused a prompt longer than max_num_batched_tokens; here it is chunked."""
    chunks, tokens, _ = prefill_chunks(phase, budget=16, prompt_len=100)
    assert chunks == [16] * 6 + [4]
    assert tokens == previous_phase_tokens(before, 100)


# --- attention: a chunk reads exactly the keys before its own end -------------------------------
def chunk_step(context_lens: list[int], query_lens: list[int], block_size: int, device: str, dtype):
    """A StepContext-like object for sequences with these contexts, each computing its last
    query_lens[b] tokens, with shuffled block tables; and the pool those tables address."""
    from types import SimpleNamespace
    widths = [-(-c // block_size) for c in context_lens]
    ids = torch.randperm(sum(widths) + 3).tolist()       # + spare blocks nobody owns
    tables, start = [], 0
    for w in widths:
        tables.append(ids[start:start + w] + [0] * (max(widths) - w))
        start += w
    cu = [0]
    for q in query_lens:
        cu.append(cu[-1] + q)
    i32 = dict(dtype=torch.int32, device=device)
    step = SimpleNamespace(is_prefill=True, cu_seqlens_q=torch.tensor(cu, **i32), cu_seqlens_q_host=cu,
                           max_query_len=max(query_lens), context_lens=torch.tensor(context_lens, **i32),
                           context_lens_host=context_lens, max_context_len=max(context_lens),
                           block_tables=torch.tensor(tables, **i32), dtype=dtype)
    return step, tables


def check_chunk_attention(backend, device: str, dtype, tol: float):
    """Queries of a chunk (and decode rows beside it) against plain causal attention over each
    whole sequence: equal. Every slot past a sequence's end, in its last block and elsewhere,
    holds a huge poison key and value: reading one would move the output far beyond tol."""
    torch.manual_seed(0)
    H, KV, D, bs = 4, 2, 64, 16
    context_lens, query_lens = [37, 16, 5, 33, 1], [21, 16, 1, 1, 1]   # chunk mid-prompt, whole prompt, decodes
    step, tables = chunk_step(context_lens, query_lens, bs, device, dtype)
    num_blocks = max(b for t in tables for b in t) + 4
    pages = [torch.full((num_blocks, bs, KV, D), 50.0, device=device, dtype=dtype) for _ in range(2)]
    keys = [torch.randn(c, KV, D, device=device, dtype=dtype) for c in context_lens]
    values = [torch.randn(c, KV, D, device=device, dtype=dtype) for c in context_lens]
    for table, k, v, c in zip(tables, keys, values, context_lens):
        for pos in range(c):
            for pool, x in zip(pages, (k, v)):
                pool[table[pos // bs], pos % bs] = x[pos]
    q = torch.randn(sum(query_lens), H, D, device=device, dtype=dtype)
    backend.prepare(step)
    out = backend.prefill(q, pages[0], pages[1], step)
    for b, (a, e) in enumerate(zip(step.cu_seqlens_q_host, step.cu_seqlens_q_host[1:])):
        c, n = context_lens[b], query_lens[b]
        full_q = torch.zeros(c, H, D, device=device, dtype=dtype)
        full_q[c - n:] = q[a:e]
        ref = torch.nn.functional.scaled_dot_product_attention(
            *(x.float().transpose(0, 1) for x in (full_q, keys[b], values[b])), is_causal=True, enable_gqa=True)
        err = (out[a:e].float() - ref.transpose(0, 1)[c - n:]).abs().max().item()
        assert err < tol, f"sequence {b}: max error {err}"


def test_torch_prefill_reads_exactly_the_keys_before_its_end(backends):
    check_chunk_attention(backends.TorchAttention(), "cpu", torch.float32, 1e-5)


@pytest.mark.gpu
def test_flash_attn_prefill_reads_exactly_the_keys_before_its_end(backends):
    """Varlen queries over the page table (seqused_k, page_table), bf16 against the fp32 reference."""
    if not backends.flash_attn_available():
        pytest.skip("needs flash-attn-4 (flash_attn.cute)")
    check_chunk_attention(backends.FlashAttention(), "cuda", torch.bfloat16, 3e-2)


@pytest.mark.gpu
def test_triton_backend_prefill_is_the_references(backends):
    check_chunk_attention(backends.TritonAttention(), "cuda", torch.bfloat16, 3e-2)


def test_engine_never_reads_an_unwritten_slot(phase, before):
    """The whole pool poisoned with NaN before the first step: one sequence at a time, chunked,
    every slot a step reads was written before it, or the logits would be NaN."""
    llm = engine(phase, block_size=BLOCK, max_num_batched_tokens=5, max_num_seqs=1)
    for layer in llm.cache.layers:
        layer.fill_(float("nan"))
    prompts = [list(range(1, 24)), list(range(7, 10))]
    outs = llm.generate(prompts, greedy())
    assert [o.token_ids for o in outs] == [o.token_ids for o in before.generate(prompts, greedy())]


# --- mixed steps, the budget, partial prefills --------------------------------------------------
def test_decodes_first_then_chunks_in_one_step(phase):
    """A running decode and a long prompt arriving: every later step holds the decode's one row and
    a chunk of what the budget leaves, in that order; the prompt samples on its last chunk only."""
    llm = engine(phase, block_size=BLOCK, max_num_batched_tokens=10, max_num_seqs=4)
    plans = recorded_plans(llm)
    first = llm.add_request([1, 2, 3], greedy(12))
    llm.step()
    second = llm.add_request(list(range(1, 31)), greedy(2))
    while llm.has_unfinished():
        llm.step()
    assert plans[:5] == [([first], [3]), ([first, second], [1, 9]), ([first, second], [1, 9]),
                         ([first, second], [1, 9]), ([first, second], [1, 3])]
    assert plans[5] == ([first, second], [1, 1])           # both decode
    check_idle(llm)


def test_at_most_max_num_partial_prefills_at_once(phase):
    """Three long prompts, a budget far below them: with a limit of 1 one prompt is chunked at a
    time; with 2, two share the budget. The prompts share no token: from the prefix-caching phase
    on, a prompt that shares a block with one still prefilling waits to reuse it."""
    for limit in (1, 2):
        llm = engine(phase, block_size=BLOCK, max_num_batched_tokens=8, max_num_seqs=4,
                     max_num_partial_prefills=limit)
        for i in range(3):
            llm.add_request(list(range(1 + 100 * i, 21 + 100 * i)), greedy(2))
        widest = 0
        while llm.has_unfinished():
            llm.step()
            partial = [s for s in llm.scheduler.running if s.num_pending_tokens > 1]
            widest = max(widest, len(partial))
        assert widest == limit
        check_idle(llm)


@pytest.mark.parametrize("option, value", [("max_num_partial_prefills", 0), ("max_num_partial_prefills", 1.5)])
def test_bad_partial_prefill_option(phase, option, value):
    with pytest.raises(ValueError, match=option):
        engine(phase, **{option: value})


# --- preemption and abort of a partly prefilled request -----------------------------------------
def preempt_mid_prefill(phase: str, preemption: str):
    """A 3-token request (priority 0, 20 tokens) decoding beside a 40-token prompt (priority 1)
    chunked 5-7 tokens a step, in an 11-block pool: at 33 tokens the prompt's next chunk finds no
    free block, and the worst-ranked sequence not planned yet is the prompt itself. Returns the
    tokens, the preemptions seen (seq id, computed tokens, prompt length) and the prompt's chunks."""
    llm = engine(phase, block_size=BLOCK, max_num_batched_tokens=8, max_num_seqs=4,
                 kv_cache_bytes=11 * BLOCK * KV_BYTES_PER_TOKEN, preemption=preemption)
    seen, preempt = [], llm.scheduler._preempt
    llm.scheduler._preempt = lambda seq, plan: seen.append((seq.seq_id, seq.num_computed_tokens,
                                                            len(seq.prompt_ids))) or preempt(seq, plan)
    plans = recorded_plans(llm)
    outs = llm.generate([[1, 2, 3], list(range(1, 41))], [greedy(20), greedy(4)], priorities=[0, 1])
    check_idle(llm)
    long_id = max(i for ids, _ in plans for i in ids)
    chunks = [n[ids.index(long_id)] for ids, n in plans if long_id in ids]
    return [o.token_ids for o in outs], seen, chunks


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preempt_and_resume_between_two_chunks(phase, before, preemption):
    tokens, seen, chunks = preempt_mid_prefill(phase, preemption)
    assert seen[0] == (1, 33, 40)                          # between its fifth and sixth chunk
    ref = before.generate([[1, 2, 3], list(range(1, 41))], [greedy(20), greedy(4)])
    assert tokens == [o.token_ids for o in ref]
    prefilled = sum(chunks) - 3                           # the last 3 of its 4 outputs were decodes
    if preemption == "swap":                              # resumed from its copy: no token twice
        assert prefilled == 40
    else:                                                 # its chunks were dropped and computed again
        assert prefilled > 40


def test_abort_mid_prefill_frees_exactly_its_blocks(phase, before):
    """A request aborted between two chunks gives back its blocks and nobody else's; the request
    beside it finishes with the previous phase's tokens."""
    llm = engine(phase, block_size=BLOCK, max_num_batched_tokens=8, max_num_seqs=4)
    keep = llm.add_request([1, 2, 3], greedy(10))
    llm.step()
    drop = llm.add_request(list(range(1, 41)), greedy(4))
    llm.step()
    llm.step()
    seq = llm.requests[drop]
    assert 0 < seq.num_computed_tokens < 40 and not seq.output_ids
    bm, held = llm.scheduler.block_manager, len(seq.block_table)
    free, other = bm.num_free_blocks, list(llm.requests[keep].block_table)
    llm.abort_request(drop)
    assert bm.num_free_blocks == free + held and llm.requests[keep].block_table == other
    outputs = {}
    while llm.has_unfinished():
        outputs.update(llm.step())
    assert list(outputs) == [keep]
    assert outputs[keep].token_ids == before.generate([[1, 2, 3]], greedy(10))[0].token_ids
    check_idle(llm)


# --- many requests, sampled and greedy, against the previous phase -------------------------------
def mixed_workload(n: int = 16, seed: int = 0):
    """n requests: prompts of 1 to 90 tokens, 1 to 30 new tokens, greedy and seeded-sampled,
    priorities 0-2, arriving over the first 20 steps."""
    rng = random.Random(seed)
    requests = []
    for i in range(n):
        prompt = [rng.randrange(1, 5000) for _ in range(rng.choice([1, 2, 7, 16, 17, 33, 64, 90]))]
        params = greedy(rng.randint(1, 30)) if i % 3 else \
            SamplingParams(temperature=0.9, top_p=0.9, seed=i, max_tokens=rng.randint(1, 30), ignore_eos=True)
        requests.append((rng.randrange(20), prompt, params, rng.randrange(3)))
    return requests


def run_arrivals(llm, requests) -> list[list[int]]:
    ids, outputs, n = {}, {}, 0
    while n < 20 or llm.has_unfinished():
        for i, (arrival, prompt, params, priority) in enumerate(requests):
            if arrival == n:
                ids[llm.add_request(prompt, params, priority=priority)] = i
        outputs.update(llm.step())
        n += 1
    check_idle(llm)
    return [outputs[r].token_ids for r in sorted(ids, key=ids.get)]


@pytest.fixture(scope="module")
def mixed_reference(previous):
    """The previous phase's tokens for mixed_workload(). A request's tokens follow from its prompt,
    parameters and seed alone (what the test below holds the phase to), so one run, in a pool
    that holds every request, answers for every budget and preemption mode."""
    return run_arrivals(engine(previous, block_size=BLOCK, max_num_seqs=16), mixed_workload())


@pytest.mark.parametrize(("budget", "preemption"), [(7, "recompute"), (17, "swap"),
                                                    *(pytest.param(b, p, marks=pytest.mark.slow)
                                                      for b, p in ((7, "swap"), (17, "recompute")))])
def test_staggered_mixed_requests_equal_previous_phase(phase, mixed_reference, budget, preemption):
    """A 36-block pool that forces preemptions, staggered arrivals, priorities, sampled rows:
    other steps than the previous phase's, the same tokens. `make test` runs each budget with one
    preemption mode (both modes and both budgets covered); `make test-all` the other two pairs."""
    pool = dict(block_size=BLOCK, kv_cache_bytes=36 * BLOCK * KV_BYTES_PER_TOKEN, preemption=preemption)
    new = engine(phase, max_num_batched_tokens=budget, max_num_seqs=min(budget, 16), **pool)
    tokens = run_arrivals(new, mixed_workload())
    assert new.scheduler.num_preemptions > 0, "the pool was meant to force preemptions"
    assert tokens == mixed_reference


# --- the pipeline: the tail rebuilds each chunk's step from the head's description ---------------
@pytest.mark.timeout(180)
def test_pipeline_chunks_give_the_in_process_tokens(phase):
    """Two stages over gloo: prompts longer than the budget are chunked by the head's scheduler;
    the tail attends over its half's pool with each sequence's computed length. Same tokens."""
    ParallelLLM = getattr(importlib.import_module(f"phases.{phase}"), "ParallelLLM", None)
    if ParallelLLM is None:
        pytest.skip("no pipeline in this phase (p16 on: tensor parallelism replaced p04's process layer)")
    options = dict(block_size=BLOCK, max_num_batched_tokens=8, max_num_seqs=4, cpu_kv_cache_bytes=1 << 21)
    prompts = [list(range(1, 30)), [5, 6, 7], list(range(40, 60))]
    params = [greedy(6), greedy(9), SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=7, ignore_eos=True)]
    expected = engine(phase, **options).generate(prompts, params)
    with ParallelLLM("tiny-llama", device="cpu", dtype="float32", **options, parallel="pipeline", world_size=2) as llm:
        outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == [e.token_ids for e in expected]
