"""p08_preemption: blocks allocated as sequences grow, priorities, preemption by recompute and by
swap. Nothing is lost: under a pool too small for the load every request gets exactly the tokens
it gets with an ample pool, and the block accounting holds after every step."""
import functools
import importlib
import random

import pytest
import torch

from common.sampling import SamplingParams

PHASE = "p08_preemption"
engine = importlib.import_module(f"phases.{PHASE}")
scheduling = importlib.import_module(f"phases.{PHASE}.scheduler")
BlockManager = importlib.import_module(f"phases.{PHASE}.block_manager").BlockManager
Sequence = importlib.import_module(f"phases.{PHASE}.sequence").Sequence
Status = importlib.import_module(f"phases.{PHASE}.sequence").Status
OPTIONS = dict(device="cpu", dtype="float32", block_size=4)
KV_BYTES_PER_BLOCK = 4 * 2 * 2 * 2 * 16 * 4     # 4 tokens x K,V x 2 layers x 2 kv heads x 16 x fp32


def seq(i, prompt_len, max_tokens=8, priority=0):
    return Sequence(i, list(range(1, prompt_len + 1)), SamplingParams(max_tokens=max_tokens), 0.0, priority)


def decode_once(scheduler, plan):
    """Pretend the step ran: every sequence of a decode (or prefill) step gains a token."""
    for s in plan.seqs:
        s.output_ids.append(0)


# --- the scheduler alone (torch-free) ----------------------------------------------------------
def test_admission_takes_only_what_the_prompt_needs():
    """Worst-case reservation (phases 02-07) would admit one of these 3 (9 blocks each: 4-token
    prompt + 32 new tokens, in blocks of 4); allocating as they grow admits all three."""
    sched = scheduling.Scheduler(BlockManager(12, 4), max_num_seqs=8, max_num_batched_tokens=100)
    for i in range(3):
        sched.add(seq(i, 4, max_tokens=32))
    plan = sched.schedule()
    assert plan.is_prefill and [s.seq_id for s in plan.seqs] == [0, 1, 2]
    assert sched.block_manager.num_free_blocks == 12 - 3


def test_priorities_order_admission_and_fcfs_within_a_priority():
    sched = scheduling.Scheduler(BlockManager(8, 4), max_num_seqs=2, max_num_batched_tokens=100)
    for i, priority in enumerate([1, 0, 1, 0]):
        sched.add(seq(i, 4, priority=priority))
    first = sched.schedule()
    assert [s.seq_id for s in first.seqs] == [1, 3]            # priority 0, in arrival order
    assert [s.seq_id for s in sched.waiting] == [0, 2]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_the_worst_ranked_running_sequence_is_preempted(mode):
    """Three sequences take 3 of 5 blocks, each block full; the next decode needs 3 more: the two
    priority-0 ones get them (best rank first), and the priority-1 one, the worst-ranked, goes
    (swapped out, or back to waiting)."""
    sched = scheduling.Scheduler(BlockManager(5, 4), max_num_seqs=8, max_num_batched_tokens=100,
                                 preemption=mode)
    for i, priority in enumerate([0, 1, 0]):
        sched.add(seq(i, 4, max_tokens=8, priority=priority))
    decode_once(sched, sched.schedule())                          # prefill: a block each, all full
    plan = sched.schedule()                                       # each needs a second block
    victims = [s for s, _ in plan.swap_out] if mode == "swap" else sched.waiting
    assert [s.seq_id for s in victims] == [1]                     # priority 1 goes first
    assert sched.num_preemptions >= 1 and all(s.priority == 0 for s in plan.seqs)
    held = [b for s in sched.running for b in s.block_table]
    assert len(held) == len(set(held)) and len(held) + sched.block_manager.num_free_blocks == 5
    assert (sched.swapped if mode == "swap" else sched.waiting)[0].status == \
        (Status.SWAPPED if mode == "swap" else Status.WAITING)


def test_a_request_that_can_never_fit_is_rejected_at_submission():
    sched = scheduling.Scheduler(BlockManager(4, 4), max_num_seqs=8, max_num_batched_tokens=100)
    with pytest.raises(ValueError, match="needs 5 KV blocks but the whole pool has 4"):
        sched.add(seq(0, 4, max_tokens=14))
    assert not sched.has_unfinished()


# --- the engine under pressure ------------------------------------------------------------------
def run_with_arrivals(llm, prompts, params, priorities, arrivals):
    """Requests added before the steps named in `arrivals`; checks the block accounting after
    every step; returns token ids in prompt order."""
    ids, outputs, n = {}, {}, 0
    while n <= max(arrivals) or llm.has_unfinished():
        for i in arrivals.get(n, []):
            ids[llm.add_request(prompts[i], params[i], priority=priorities[i])] = i
        outputs.update(llm.step())
        sched, bm = llm.scheduler, llm.scheduler.block_manager
        held = [b for s in sched.running for b in s.block_table]
        assert len(held) == len(set(held)) and sorted(held + list(bm.free_ids)) == list(range(bm.num_blocks))
        assert all(not s.block_table for s in sched.waiting + sched.swapped)
        assert set(llm.swapped_kv) == {s.seq_id for s in sched.swapped}
        n += 1
    assert bm.num_free_blocks == bm.num_blocks and not llm.swapped_kv
    return [outputs[r].token_ids for r in sorted(ids, key=ids.get)]


def trial_workload(trial: int):
    """Random prompts, lengths, arrivals, priorities, greedy and seeded sampling (seeded by the
    trial); returns the generator too, which goes on to draw the small pool."""
    rng = random.Random(trial)
    n = 10
    prompts = [[rng.randrange(1, 1000) for _ in range(rng.randint(3, 40))] for _ in range(n)]
    params = [SamplingParams(temperature=rng.choice([0, 0.8]), top_p=0.9, seed=i, max_tokens=rng.randint(4, 40),
                             ignore_eos=True) for i in range(n)]
    priorities = [rng.randint(0, 2) for _ in range(n)]
    arrivals = {}
    for i in range(n):
        arrivals.setdefault(rng.randint(0, 12), []).append(i)
    return rng, prompts, params, priorities, arrivals


@functools.cache
def ample_pool_tokens(trial: int) -> list[list[int]]:
    """The trial's tokens on an ample pool: computed once, for both preemption modes."""
    _, *workload = trial_workload(trial)
    return run_with_arrivals(engine.LLM("tiny-llama", cpu_kv_cache_bytes=1 << 20, **OPTIONS), *workload)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("trial", range(4))
def test_nothing_is_lost_under_pressure(mode, trial):
    """Random prompts, lengths, arrivals, priorities, greedy and seeded sampling, and a pool
    between one request's worst case and a few: the tokens an ample pool gives, exactly."""
    rng, prompts, params, priorities, arrivals = trial_workload(trial)
    expected = ample_pool_tokens(trial)
    worst = max(-(-(len(p) + q.max_tokens) // 4) for p, q in zip(prompts, params))
    small = engine.LLM("tiny-llama", cpu_kv_cache_bytes=rng.randint(worst, 2 * worst) * KV_BYTES_PER_BLOCK,
                       preemption=mode, **OPTIONS)
    assert run_with_arrivals(small, prompts, params, priorities, arrivals) == expected
    assert small.scheduler.num_preemptions > 0                 # the pool really was too small


def test_swap_restores_blocks_bit_exact():
    llm = engine.LLM("tiny-llama", cpu_kv_cache_bytes=64 * KV_BYTES_PER_BLOCK, **OPTIONS)
    for layer in llm.cache.layers:
        layer.copy_(torch.randn_like(layer))
    before = [layer[:, [3, 7, 1]].clone() for layer in llm.cache.layers]
    saved = llm.cache.save([3, 7, 1])
    llm.cache.restore([10, 11, 12], saved)
    assert all(torch.equal(layer[:, [10, 11, 12]], b) for layer, b in zip(llm.cache.layers, before))


def test_bad_priority_and_pipeline_swap_are_clear_errors():
    llm = engine.LLM("tiny-llama", **OPTIONS)
    with pytest.raises(ValueError, match="priority must be an integer"):
        llm.add_request([1, 2, 3], SamplingParams(max_tokens=2), priority="high")
    with pytest.raises(ValueError, match="2 priorities for 1 prompts"):
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2), priorities=[0, 1])
    with pytest.raises(ValueError, match="preemption must be"):
        engine.LLM("tiny-llama", preemption="evict", **OPTIONS)
