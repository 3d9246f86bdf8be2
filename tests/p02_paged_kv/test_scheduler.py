"""Scheduler with a fake model (every step samples token 0): no torch, milliseconds."""
import importlib
import inspect
import re

import pytest

from common.sampling import SamplingParams

PHASE = "p02_paged_kv"
scheduler = importlib.import_module(f"phases.{PHASE}.scheduler")
BlockManager = importlib.import_module(f"phases.{PHASE}.block_manager").BlockManager
sequence = importlib.import_module(f"phases.{PHASE}.sequence")
Sequence, Status = sequence.Sequence, sequence.Status


def make(num_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=64):
    return scheduler.Scheduler(BlockManager(num_blocks, block_size), max_num_seqs, max_num_batched_tokens)


def seq(seq_id, prompt_len, max_tokens=4):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return Sequence(seq_id, list(range(prompt_len)), params, 0.0)


def step(sched):
    """One scheduled step with a fake model; returns (ids in the batch, prefill?, ids finished)."""
    seqs, is_prefill = sched.schedule()
    for s in seqs:
        s.append(0, 0.0, eos_ids=[], decode=lambda ids: "")
    done = sched.finish(seqs)
    return [s.seq_id for s in seqs], is_prefill, [s.seq_id for s in done]


def check_blocks(sched):
    """Live block tables are disjoint, and with the free list they account for every block."""
    bm = sched.block_manager
    held = [b for s in sched.running for b in s.block_table]
    assert len(held) == len(set(held)), "a block is shared by two live sequences"
    assert sorted(held + list(bm.free_ids)) == list(range(bm.num_blocks)), "a block leaked"


def test_is_torch_free():
    assert not re.search(r"^\s*(import|from)\s+torch", inspect.getsource(scheduler), re.M)


def test_prefill_first_then_decode_everyone():
    sched = make()
    for i, n in enumerate((5, 9, 3)):
        sched.add(seq(i, n))
    assert step(sched) == ([0, 1, 2], True, [])
    assert step(sched) == ([0, 1, 2], False, [])
    assert all(s.status is Status.RUNNING for s in sched.running)


def test_late_arrival_joins_at_the_next_step():
    sched = make()
    sched.add(seq(0, 5, max_tokens=3))
    step(sched)                                     # prefill 0
    sched.add(seq(1, 7, max_tokens=4))
    assert step(sched) == ([1], True, [])           # 1 is admitted before 0 decodes again
    assert step(sched) == ([0, 1], False, [])
    assert step(sched) == ([0, 1], False, [0])      # 0 had 3 tokens: done, blocks back at once
    assert step(sched) == ([1], False, [1])
    assert not sched.has_unfinished()
    assert sched.block_manager.num_free_blocks == 64


def test_max_num_seqs_caps_the_running_batch():
    sched = make(max_num_seqs=2)
    for i in range(3):
        sched.add(seq(i, 4, max_tokens=2))
    assert step(sched) == ([0, 1], True, [])
    assert step(sched) == ([0, 1], False, [0, 1])
    assert step(sched) == ([2], True, [])


def test_token_budget_splits_prefills_first_come_first_served():
    sched = make(max_num_batched_tokens=10)
    for i, n in enumerate((6, 6, 2)):
        sched.add(seq(i, n))
    assert step(sched)[:2] == ([0], True)          # 6 + 6 > 10, and 2 may not overtake 1
    assert step(sched)[:2] == ([1, 2], True)


def test_waits_for_blocks_and_never_leaks():
    sched = make(num_blocks=6, block_size=4)
    sched.add(seq(0, 8, max_tokens=8))              # 16 tokens -> all 4 blocks it may need are reserved
    sched.add(seq(1, 8, max_tokens=8))              # needs 4, only 2 unpromised: waits
    assert step(sched)[:2] == ([0], True)
    while 0 not in step(sched)[2]:
        check_blocks(sched)
        assert [s.seq_id for s in sched.waiting] == [1]
    assert step(sched)[:2] == ([1], True)           # admitted the step after 0 freed its blocks
    while sched.has_unfinished():
        step(sched)
        check_blocks(sched)
    bm = sched.block_manager
    assert bm.num_free_blocks == 6 and bm.num_reserved == 0 and bm.reserved == {}


def test_many_mixed_requests_keep_blocks_consistent():
    sched = make(num_blocks=40, block_size=4, max_num_seqs=5, max_num_batched_tokens=40)
    lengths = [(3, 9), (17, 2), (8, 13), (1, 1), (25, 6), (4, 20), (12, 12), (30, 3)]
    for i, (p, m) in enumerate(lengths):
        sched.add(seq(i, p, m))
    finished, steps = [], 0
    while sched.has_unfinished():
        finished += step(sched)[2]
        check_blocks(sched)
        steps += 1
        assert steps < 200, "the scheduler stopped making progress"
    assert sorted(finished) == list(range(len(lengths)))
    assert sched.block_manager.num_free_blocks == 40


@pytest.mark.parametrize("prompt_len, max_tokens, message", [
    (10, 30, r"needs 10 KV blocks but the whole pool has 8"),
    (70, 1, r"exceeds max_num_batched_tokens \(64\)"),
])
def test_never_fits_is_rejected_on_add(prompt_len, max_tokens, message):
    sched = make(num_blocks=8 if prompt_len < 64 else 64)
    with pytest.raises(ValueError, match=message):
        sched.add(seq(0, prompt_len, max_tokens))
    assert not sched.has_unfinished()


def test_fits_exactly_runs():
    sched = make(num_blocks=8, block_size=4)
    sched.add(seq(0, 20, max_tokens=12))           # 32 tokens = the whole pool
    while sched.has_unfinished():
        step(sched)
        check_blocks(sched)
