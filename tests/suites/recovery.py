"""A generate() that fails mid-call (an exception or Ctrl-C inside a step) leaves the engine
usable: the call's requests are aborted, their KV blocks are free again, and the next call
gives the same tokens as before the failure."""
import sys

import pytest

from common.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=8, ignore_eos=True, seed=11)
PROMPTS = [[5, 6, 7, 8], [9, 10, 11], list(range(20, 60))]


@pytest.fixture(scope="module")
def llm(LLM):
    return LLM("tiny-llama", device="cpu", dtype="float32", max_model_len=128)


@pytest.fixture(scope="module")
def expected(llm):
    """What the engine answers before anything failed."""
    return _tokens(llm)


def _tokens(llm):
    return [o.token_ids for o in llm.generate(PROMPTS, [GREEDY, SEEDED, GREEDY])]


def _fail_once(monkeypatch, owner, name, error, after_calls=0):
    """Make owner.name raise `error` on its (after_calls + 1)-th call, once; later calls work."""
    real, calls = getattr(owner, name), []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == after_calls + 1:
            raise error
        return real(*args, **kwargs)
    monkeypatch.setattr(owner, name, flaky)


def _sampler_owner(llm):
    """The engine module and the name under which it calls the sampler."""
    module = sys.modules[type(llm).__module__]
    return module, "sample_batch" if hasattr(module, "sample_batch") else "sample"


def _assert_idle(llm):
    """Nothing waiting or running, every KV block free, no RNG left behind (paged phases)."""
    if not hasattr(llm, "scheduler"):
        return                                   # serial engine: each call owns its own cache
    scheduler, blocks = llm.scheduler, llm.scheduler.block_manager
    assert not scheduler.waiting and not scheduler.running
    assert blocks.num_free_blocks == blocks.num_blocks and getattr(blocks, "num_reserved", 0) == 0
    assert not llm.generators


@pytest.mark.parametrize("after_calls", [0, 2])        # in the prefill, or in a later decode step
@pytest.mark.parametrize("error", [RuntimeError("forward failed"), KeyboardInterrupt()])
def test_failed_forward_leaves_engine_usable(llm, expected, monkeypatch, error, after_calls):
    with monkeypatch.context() as patch:
        _fail_once(patch, llm.model, "forward", error, after_calls)
        with pytest.raises(type(error)):
            llm.generate(PROMPTS, [GREEDY, SEEDED, GREEDY])
    _assert_idle(llm)
    assert _tokens(llm) == expected


@pytest.mark.parametrize("error", [RuntimeError("sampler failed"), KeyboardInterrupt()])
def test_failed_sampler_leaves_engine_usable(llm, expected, monkeypatch, error):
    with monkeypatch.context() as patch:
        _fail_once(patch, *_sampler_owner(llm), error, after_calls=1)
        with pytest.raises(type(error)):
            llm.generate(PROMPTS, [GREEDY, SEEDED, GREEDY])
    _assert_idle(llm)
    assert _tokens(llm) == expected


def test_second_ctrl_c_in_the_clean_up_leaves_engine_usable(llm, expected, monkeypatch):
    """Ctrl-C twice: the first stops a step, the second lands in generate()'s own clean-up, after
    it dropped one request and before the others. The next generate() finishes that clean-up
    instead of refusing ("needs an idle engine") a user who never called add_request()."""
    if not hasattr(llm, "scheduler"):
        pytest.skip("the serial engine builds its KV cache per request: it has nothing to clean up")
    with monkeypatch.context() as patch:
        real_forward = llm.model.forward

        def first_ctrl_c(*args, **kwargs):      # the decode step: arm the second, then raise
            if llm.scheduler.running and llm.scheduler.running[0].output_ids:
                _fail_once(patch, llm.scheduler, "abort", KeyboardInterrupt(), after_calls=1)
                raise KeyboardInterrupt
            return real_forward(*args, **kwargs)
        patch.setattr(llm.model, "forward", first_ctrl_c)
        with pytest.raises(KeyboardInterrupt):
            llm.generate(PROMPTS, [GREEDY, SEEDED, GREEDY])
    assert llm.has_unfinished()                  # the cut-short clean-up left requests behind
    assert _tokens(llm) == expected
    _assert_idle(llm)


def test_after_failure_matches_fresh_engine(LLM, llm, monkeypatch):
    """The engine that recovered answers like one that never failed."""
    with monkeypatch.context() as patch:
        _fail_once(patch, llm.model, "forward", RuntimeError("boom"), after_calls=1)
        with pytest.raises(RuntimeError):
            llm.generate(PROMPTS, GREEDY)
    fresh = LLM("tiny-llama", device="cpu", dtype="float32", max_model_len=128)
    assert _tokens(llm) == _tokens(fresh)
