"""Continuous batching end to end: requests join between steps and still get the reference tokens.

The reference is HF greedy (tests/reference.py), which p01 reproduces exactly, so equal to it
means equal to p01. Block accounting is checked after every step.
"""

import pytest

from common.sampling import SamplingParams
from tests.reference import REF_NEW_TOKENS


TINY = ("tiny-llama", "tiny-qwen2")
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4      # K and V x 2 layers x 2 kv heads x head_dim 16 x fp32
# The pool where a test sets none: 8192 tokens, room for every request here. The default
# (max_num_seqs x max_model_len, 256 MiB) is zeroed at each build, and check_blocks() sorts every
# block id of the pool after every step.
POOL = {"cpu_kv_cache_bytes": 8192 * KV_BYTES_PER_TOKEN}


def greedy(max_tokens=REF_NEW_TOKENS):
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


@pytest.fixture(scope="module")
def make(LLM):
    """make(preset, **options): an fp32 CPU engine of the phase under test."""
    def build(preset="tiny-llama", **options):
        return LLM(preset, device="cpu", dtype="float32", **POOL | options)
    return build


@pytest.fixture(scope="module")
def tiny(make):
    """One tiny-llama engine for the tests below that only need an engine with default options
    (each leaves it idle)."""
    return make()


def check_blocks(llm):
    """No block is held by two live sequences, and held + free blocks are the whole pool. With a
    prefix cache (its tree's blocks(): shared read-only, or kept for later), that holds for the
    blocks outside the tree, and the tree's blocks are the rest."""
    bm, running = llm.scheduler.block_manager, llm.scheduler.running
    tree = bm.tree.blocks() if hasattr(bm, "tree") else []
    shared = set(tree)
    held = [b for seq in running for b in seq.block_table if b not in shared]
    assert len(held) == len(set(held)), "a block is shared by two live sequences"
    assert sorted(held + tree + list(bm.free_ids)) == list(range(bm.num_blocks)), "a block leaked"


def check_idle(llm):
    bm = llm.scheduler.block_manager
    assert not llm.has_unfinished() and llm.generators == {}
    assert bm.num_free_blocks == bm.num_blocks and getattr(bm, "num_reserved", 0) == 0   # (phases that reserve)


def run_staggered(llm, prompts, params, arrivals):
    """arrivals: {step number: [prompt index, ...]} added just before that step. Returns the
    outputs in prompt order and how many requests ran together at most."""
    ids, outputs, widest, n = {}, {}, 0, 0
    while n <= max(arrivals) or llm.has_unfinished():
        for i in arrivals.get(n, []):
            ids[llm.add_request(prompts[i], params[i])] = i
        outputs.update(llm.step())
        check_blocks(llm)
        widest, n = max(widest, len(llm.scheduler.running)), n + 1
    return [outputs[rid] for rid in sorted(ids, key=ids.get)], widest


@pytest.mark.parametrize("preset", TINY)
def test_staggered_arrivals_match_reference(preset, prompts_for, hf_reference, make):
    """Prompts of 600, 9, 32, 32 tokens arrive at steps 0, 2, 5, 5 and stop after different
    numbers of tokens; 4-token blocks put many block boundaries in every sequence."""
    prompts, ref = prompts_for(preset), hf_reference(preset)
    params = [greedy(REF_NEW_TOKENS - 8 * i) for i in range(len(prompts))]
    llm = make(preset, block_size=4)
    outs, widest = run_staggered(llm, prompts, params, {0: [3], 2: [0], 5: [1, 2]})
    assert widest == 4                           # all four really ran in one batch
    for i, out in enumerate(outs):
        assert out.token_ids == ref[i][:params[i].max_tokens], f"prompt {i}"
        assert out.finish_reason == "length"
    check_idle(llm)


def test_requests_wait_for_blocks_and_seats(prompts_for, hf_reference, make):
    """A pool that holds the 600-token request alone, and two seats: the others queue, are
    admitted when blocks come back, and their tokens do not change."""
    prompts, ref = prompts_for("tiny-llama"), hf_reference("tiny-llama")
    blocks = -(-(600 + REF_NEW_TOKENS) // 16) + 2
    llm = make(block_size=16, cpu_kv_cache_bytes=blocks * 16 * KV_BYTES_PER_TOKEN, max_num_seqs=2)
    assert llm.cache.num_blocks == blocks
    outs, widest = run_staggered(llm, prompts, [greedy()] * 4, {0: [0, 3, 1, 2]})
    assert widest == 2
    assert [o.token_ids for o in outs] == ref
    check_idle(llm)


def test_generate_is_built_on_steps(prompts_for, hf_reference, make):
    """generate() of a mixed batch equals the reference, and leaves the engine idle."""
    llm = make("tiny-qwen2")
    outs = llm.generate(prompts_for("tiny-qwen2"), greedy())
    assert [o.token_ids for o in outs] == hf_reference("tiny-qwen2")
    check_idle(llm)
    assert llm.step() == []                      # nothing to do is not an error


def test_never_fits_is_a_clear_error_before_any_work(make):
    """prompt + max_tokens beyond the whole pool, or a prompt beyond the step's token budget."""
    llm = make(block_size=16, cpu_kv_cache_bytes=8 * 16 * KV_BYTES_PER_TOKEN, max_num_seqs=4,
               max_num_batched_tokens=100)
    ok = greedy(4)
    with pytest.raises(ValueError, match=r"^request 1: prompt \+ max_tokens \(140 tokens\) needs 9 KV blocks "
                                         r"but the whole pool has 8"):    # which request, and why
        llm.generate([[1, 2, 3], list(range(1, 121))], [ok, greedy(20)])
    if not hasattr(llm.config, "max_num_partial_prefills"):     # chunked prefill takes any prompt length
        with pytest.raises(ValueError, match=r"^request 2: its prompt \(101 tokens\) exceeds max_num_batched_tokens"):
            llm.generate([[1, 2, 3], [4, 5], list(range(1, 102))], ok)
        with pytest.raises(ValueError, match=r"prompt \(101 tokens\) exceeds max_num_batched_tokens \(100\)"):
            llm.add_request(list(range(1, 102)), ok)
    check_idle(llm)                              # the good request was not queued either
    assert len(llm.generate([[1, 2, 3]], ok)[0].token_ids) == 4


def test_pool_is_sized_from_the_byte_budget(make):
    """num_blocks = budget // bytes per block, but never more than max_num_seqs full-length
    sequences could fill; a budget below one block is an error."""
    assert make(block_size=16, cpu_kv_cache_bytes=1 << 20).cache.num_blocks == (1 << 20) // (16 * KV_BYTES_PER_TOKEN)
    capped = make(block_size=16, cpu_kv_cache_bytes=1 << 20, max_num_seqs=2, max_model_len=100)
    assert capped.cache.num_blocks == 2 * 7
    k_and_v = capped.cache.layers[0]
    scratch = int(hasattr(capped.cache, "scratch_block"))   # p14: one block more, owned by no sequence
    assert k_and_v.shape == (2, 14 + scratch, 16, 2, 16) and len(capped.cache.layers) == 2
    with pytest.raises(ValueError, match="holds no block"):
        make(block_size=16, cpu_kv_cache_bytes=100)


@pytest.mark.parametrize("option, value", [("block_size", 0), ("max_num_seqs", -1), ("cpu_kv_cache_bytes", 0),
                                           ("gpu_memory_utilization", 1.5), ("max_num_batched_tokens", 8)])
def test_bad_engine_options(option, value, make):
    with pytest.raises(ValueError, match=option):
        make(**{option: value})


def test_generate_refuses_a_busy_engine_and_shows_progress(capsys, tiny):
    llm = tiny
    llm.add_request([1, 2, 3], greedy(2))
    with pytest.raises(RuntimeError, match="idle engine"):
        llm.generate([[4, 5]], greedy(2))
    while llm.has_unfinished():
        llm.step()
    llm.generate([[4, 5], [6, 7, 8]], greedy(2), use_tqdm=True)
    assert "requests: 100%" in capsys.readouterr().err


def test_seeded_sampling_in_a_batch_matches_alone(prompts_for, tiny):
    """A seeded sampled request draws from its own generator, next to greedy and unseeded ones."""
    llm, prompts = tiny, prompts_for("tiny-llama")
    seeded = SamplingParams(temperature=0.9, top_k=50, max_tokens=16, seed=11)
    alone = llm.generate([prompts[1]], seeded)[0].token_ids
    batch = llm.generate(prompts[:3], [greedy(16), seeded, SamplingParams(temperature=1.0, max_tokens=16)])
    assert batch[1].token_ids == alone
