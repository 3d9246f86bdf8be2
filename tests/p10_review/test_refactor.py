"""The refactor changes no behaviour: p10 plans the same steps as p09 and gives the same token ids
(many prompt lengths, staggered arrivals, priorities, a pool small enough to preempt, by recompute
and by swap); its StepPlan counts each step's new tokens against one budget; one StepContext
describes a prefill and a decode alike."""
import importlib
import random

import pytest

from common.sampling import SamplingParams

PHASE, PREVIOUS = "p10_review", "p09_http_serving"
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4      # tiny-llama: K and V x 2 layers x 2 kv heads x head_dim 16 x fp32
BLOCK = 4


def engine(phase: str, **options):
    LLM = importlib.import_module(f"phases.{phase}").LLM
    return LLM("tiny-llama", device="cpu", dtype="float32", block_size=BLOCK, **options)


def mixed_workload(n: int = 24, seed: int = 0):
    """n requests: prompts of 1 to 90 tokens, 1 to 40 new tokens, greedy and seeded-sampled,
    priorities 0-2, arriving over the first 30 steps."""
    rng = random.Random(seed)
    requests = []
    for i in range(n):
        prompt = [rng.randrange(1, 5000) for _ in range(rng.choice([1, 2, 3, 7, 15, 16, 17, 33, 64, 90]))]
        params = SamplingParams(temperature=0, max_tokens=rng.randint(1, 40), ignore_eos=True) if i % 3 else \
            SamplingParams(temperature=0.9, top_p=0.9, seed=i, max_tokens=rng.randint(1, 40), ignore_eos=True)
        requests.append((rng.randrange(30), prompt, params, rng.randrange(3)))
    return requests


def run(llm, requests):
    """Step the engine to the end; returns the token ids in request order and every plan it ran:
    (prefill?, ids of its sequences, preemptions so far)."""
    plans, schedule = [], llm.scheduler.schedule

    def recording():
        plan = schedule()
        plans.append((plan.is_prefill, [s.seq_id for s in plan.seqs], llm.scheduler.num_preemptions))
        return plan
    llm.scheduler.schedule = recording
    ids, outputs, n = {}, {}, 0
    while n < 30 or llm.has_unfinished():
        for i, (arrival, prompt, params, priority) in enumerate(requests):
            if arrival == n:
                ids[llm.add_request(prompt, params, priority=priority)] = i
        outputs.update(llm.step())
        n += 1
    return [outputs[r].token_ids for r in sorted(ids, key=ids.get)], plans


@pytest.mark.parametrize(("budget", "preemption"), [(16384, "recompute"), (100, "swap"),
                                                    *(pytest.param(b, p, marks=pytest.mark.slow)
                                                      for b, p in ((16384, "swap"), (100, "recompute")))])
def test_same_plans_and_tokens_as_previous_phase(preemption, budget):
    """A 36-block pool (144 tokens) for 24 requests of up to 130: preemptions happen; a budget of
    100 tokens splits admissions over several prefill steps. Every step and every token agree.
    `make test` runs each budget with one preemption mode (both modes and both budgets covered);
    `make test-all` the other two pairs."""
    requests = mixed_workload()
    options = dict(kv_cache_bytes=36 * BLOCK * KV_BYTES_PER_TOKEN, preemption=preemption,
                   max_num_batched_tokens=budget, max_num_seqs=16)
    new_tokens, new_plans = run(engine(PHASE, **options), requests)
    old_tokens, old_plans = run(engine(PREVIOUS, **options), requests)
    assert new_plans == old_plans
    assert new_tokens == old_tokens
    assert new_plans[-1][2] > 0, "the pool was meant to force preemptions"
    assert [len(t) for t in new_tokens] == [p.max_tokens for _, _, p, _ in requests]


def test_a_plan_counts_new_tokens_against_one_budget():
    """A prefill's sequences draw their prefill length, a decode's one token each; a prefill step
    stops at the budget."""
    llm = engine(PHASE, max_num_batched_tokens=40, max_num_seqs=8)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    for n in (30, 8, 5, 40):
        llm.add_request(list(range(1, n + 1)), params)
    plans, schedule = [], llm.scheduler.schedule
    llm.scheduler.schedule = lambda: plans.append(schedule()) or plans[-1]
    while llm.has_unfinished():
        llm.step()
    prefills = [(p.num_new_tokens, p.num_batched_tokens) for p in plans if p.is_prefill]
    assert prefills == [([30, 8], 38), ([5], 5), ([40], 40)]   # 38 + 5 > 40, then 5 + 40 > 40
    decodes = [p for p in plans if not p.is_prefill]
    assert decodes and all(p.num_new_tokens == [1] * len(p.seqs) for p in decodes)


def test_one_step_context_for_prefill_and_decode():
    """The same fields, from the same code, for both kinds of step: query lengths, context
    lengths, block tables, slots and the rows sampled."""
    llm = engine(PHASE, max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for n in (5, 2):
        llm.add_request(list(range(1, n + 1)), params)
    steps, prepare = [], llm.runner.prepare
    llm.runner.prepare = lambda plan: steps.append(prepare(plan)) or steps[-1]
    llm.step()
    llm.step()
    (ids, pre), (ids2, dec) = steps
    tables = [s.block_table for s in llm.scheduler.running]     # [[0, 1], [2]]: 4-token blocks
    assert pre.is_prefill and not dec.is_prefill
    assert ids.tolist() == [1, 2, 3, 4, 5, 1, 2] and len(ids2) == 2
    assert pre.cu_seqlens_q.tolist() == [0, 5, 7] and dec.cu_seqlens_q.tolist() == [0, 1, 2]
    assert pre.cu_seqlens_q_host == [0, 5, 7] and (pre.max_query_len, dec.max_query_len) == (5, 1)
    assert pre.context_lens.tolist() == [5, 2] and dec.context_lens.tolist() == [6, 3]
    assert (pre.max_context_len, dec.max_context_len) == (5, 6)
    assert pre.block_tables.tolist() == dec.block_tables.tolist() == [tables[0], tables[1] + [0]]
    slot = [t * BLOCK + i for t in tables[0] for i in range(BLOCK)]
    assert pre.slot_mapping.tolist() == slot[:5] + [tables[1][0] * BLOCK + i for i in range(2)]
    assert dec.slot_mapping.tolist() == [slot[5], tables[1][0] * BLOCK + 2]
    assert pre.last_rows.tolist() == [4, 6] and dec.last_rows.tolist() == [0, 1]
