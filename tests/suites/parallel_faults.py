"""The engine over worker processes under faults: an interrupted or failed call leaves it ready
for the next (whose outputs are its own), a dead worker is named on every later call, workers
die with a killed parent, a script without the __main__ guard gets the workers' real error, and
LLM(parallel=...) points at ParallelLLM instead of quietly becoming it.

The tests marked worker_code run in a phase only where its worker.py or worker_pool.py changed
(tests/conftest.py): in the others the processes run the same code byte for byte."""
import importlib
import inspect
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from common.sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[2]
MODES = {"replica": dict(parallel="replica", world_size=2), "pipeline": dict(parallel="pipeline", world_size=2)}
# A KV pool of exactly 32 blocks of 4 tokens in every mode (max_num_seqs * max_model_len caps it),
# and one seat: a request of 128 tokens needs the whole pool, so it runs only on an idle engine.
OPTIONS = dict(device="cpu", dtype="float32", block_size=4, max_model_len=128, max_num_seqs=1,
               max_num_batched_tokens=128)
WHOLE_POOL = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)     # 8 + 120 tokens


@pytest.fixture(scope="module")
def ParallelLLM(phase):  # noqa: N802 - named like the class it returns
    return importlib.import_module(f"phases.{phase}").ParallelLLM


@pytest.fixture(scope="module", params=list(MODES))
def parallel_llm(request, ParallelLLM):  # noqa: N803
    with ParallelLLM("tiny-llama", **OPTIONS, **MODES[request.param]) as llm:
        yield llm


@pytest.fixture(scope="module")
def next_call(LLM):  # noqa: N803
    """The call after the interrupted one: its prompts and what one in-process engine answers."""
    prompts = [[11 + i] * 8 for i in range(3)]
    params = [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)] * 2 + [WHOLE_POOL]
    return prompts, params, [o.token_ids for o in LLM("tiny-llama", **OPTIONS).generate(prompts, params)]


def interrupt_after(llm, monkeypatch, exc: BaseException, replies_in: bool) -> None:
    """Make the pool's next wait for replies raise `exc`: at once (the workers are mid-call), or
    once the workers' replies are in the queue (they arrive late, to the next call)."""
    def gather(*args, **kwargs):
        monkeypatch.undo()
        deadline = time.monotonic() + 30
        while replies_in and llm.pool.results.empty() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3 if replies_in else 0)           # every worker's reply, not just the first
        raise exc
    monkeypatch.setattr(llm.pool, "gather", gather)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("exc,replies_in", [(KeyboardInterrupt(), False), (RuntimeError("hook"), True)],
                         ids=["ctrl-c-mid-call", "error-after-replies"])
def test_next_call_after_an_interrupted_one_gets_its_own_outputs(parallel_llm, next_call, monkeypatch,
                                                                  exc, replies_in):
    """Ctrl-C reaches the workers too (the whole process group): they must ignore it. The
    interrupted call's requests are aborted in the workers (the next call's last request needs the
    whole KV pool and the only seat: it would wait for ever) and its late replies are dropped."""
    if isinstance(exc, KeyboardInterrupt):
        for proc in parallel_llm.pool.procs:
            os.kill(proc.pid, signal.SIGINT)
    old = [[7] * 8, [8] * 8, [9] * 8]
    params = SamplingParams(temperature=0, max_tokens=8 if replies_in else 120, ignore_eos=True)
    interrupt_after(parallel_llm, monkeypatch, exc, replies_in)
    with pytest.raises(type(exc)):
        parallel_llm.generate(old, params)
    prompts, params, expected = next_call
    outs = parallel_llm.generate(prompts, params)
    assert [o.prompt_token_ids for o in outs] == prompts and [o.token_ids for o in outs] == expected


@pytest.mark.timeout(60)
def test_a_call_that_fails_in_a_worker_leaves_the_engine_usable(parallel_llm, next_call):
    """A worker whose call raises reports it and serves on (a malformed command stands in for
    any failure inside a step)."""
    with pytest.raises(RuntimeError, match=r"(?s)worker 0 failed this call.*TypeError"):
        parallel_llm.pool.call({0: ("generate", None)})
    prompts, params, expected = next_call
    assert [o.token_ids for o in parallel_llm.generate(prompts, params)] == expected


@pytest.mark.worker_code
@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", list(MODES))
def test_a_dead_worker_is_named_on_every_later_call(ParallelLLM, mode):  # noqa: N803
    llm = ParallelLLM("tiny-llama", **OPTIONS, **MODES[mode])
    os.kill(llm.pool.procs[1].pid, signal.SIGKILL)
    llm.pool.procs[1].join(10)
    for _ in range(2):                                 # replicas: the call need not even use it
        with pytest.raises(RuntimeError, match=r"worker 1 died \(exit code -9\)"):
            llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4))


def run_script(body: str, tmp_path: Path, phase: str) -> subprocess.Popen:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body).format(phase=phase, options=OPTIONS))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=tmp_path)


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie its new parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.worker_code
@pytest.mark.timeout(90)
def test_workers_exit_when_the_parent_is_killed(phase, tmp_path):
    """One parent holds an engine of each mode (one start of the script for both)."""
    parent = run_script("""
        import time
        from phases.{phase} import ParallelLLM
        if __name__ == "__main__":
            llms = [ParallelLLM("tiny-llama", **{options}, parallel=mode, world_size=2) for mode in %r]
            print(*(p.pid for llm in llms for p in llm.pool.procs), flush=True)
            time.sleep(600)
        """ % list(MODES), tmp_path, phase)
    try:
        pids = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(pids) == 2 * len(MODES), parent.stderr.read()
    finally:
        parent.kill()                                  # SIGKILL: no atexit, no finalizers
        parent.wait()
    deadline = time.monotonic() + 10
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(gone(pid) for pid in pids)


@pytest.mark.worker_code
@pytest.mark.timeout(90)
def test_a_script_without_the_main_guard_gets_the_workers_error(phase, tmp_path):
    """Each worker runs the script again (forkserver, like spawn); there it tries to start workers of its own
    and fails. The parent's error must carry that reason, not just an exit code."""
    parent = run_script("""
        from phases.{phase} import ParallelLLM
        try:
            llm = ParallelLLM("tiny-llama", **{options}, parallel="replica", world_size=2)
        except RuntimeError as e:
            if __name__ != "__main__":                 # in a worker: fail as starting it made it fail
                raise
            print("PARENT:", e)
        """, tmp_path, phase)
    out, err = parent.communicate(timeout=80)
    assert "PARENT: worker" in out and "bootstrapping phase" in out.split("PARENT:", 1)[1], out + err
    assert "if __name__ == '__main__':" in out


def test_LLM_points_at_ParallelLLM_and_starts_no_process(LLM, ParallelLLM):  # noqa: N802, N803
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match=r"ParallelLLM\(model, parallel="):
        LLM("tiny-llama", **OPTIONS, **MODES["replica"])
    with pytest.raises(ValueError, match="ParallelLLM needs parallel='replica' or 'pipeline'"):
        ParallelLLM("tiny-llama", **OPTIONS)
    assert set(multiprocessing.active_children()) == before


def test_pipeline_with_swap_is_refused_before_any_worker_starts(LLM, ParallelLLM):  # noqa: N803
    """The tail holds half of every sequence's K/V, so the pipeline preempts by recompute only:
    said at construction, not after the workers' start-up inside a worker's traceback."""
    if "preemption" not in inspect.signature(importlib.import_module(LLM.__module__).EngineConfig).parameters:
        pytest.skip("no preemption in this phase")
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match="the pipeline preempts by recompute only"):
        ParallelLLM("tiny-llama", **OPTIONS, **MODES["pipeline"], preemption="swap")
    assert set(multiprocessing.active_children()) == before


def test_priorities_reach_the_workers(LLM, parallel_llm):  # noqa: N803
    """One seat per scheduler: requests 0 and 2 share a replica (or the pipeline head's group),
    and so do 1 and 3; priorities put the later ones first, as LLM.generate's do."""
    if "priorities" not in inspect.signature(LLM.generate).parameters:
        pytest.skip("no priorities in this phase")
    prompts, params = [[11 + i] * 8 for i in range(4)], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = parallel_llm.generate(prompts, params, priorities=[1, 1, 0, 0])
    assert outs[2].token_times[0] < outs[0].token_times[0] and outs[3].token_times[0] < outs[1].token_times[0]
    plain = parallel_llm.generate(prompts, params)
    assert plain[0].token_times[0] < plain[2].token_times[0]
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    with pytest.raises(ValueError, match="3 priorities for 4 prompts"):
        parallel_llm.generate(prompts, params, priorities=[0, 0, 0])


def test_the_bench_builds_ParallelLLM_for_a_parallel_mode(phase, monkeypatch):  # noqa: N802
    from common.engines import make_engine
    module = importlib.import_module(f"phases.{phase}")
    monkeypatch.setattr(module, "ParallelLLM", lambda *args, **kwargs: ("parallel", args, kwargs))
    kind, args, kwargs = make_engine(phase[:3], "tiny-llama", "cpu", "float32", **MODES["pipeline"])
    assert (kind, args, kwargs["parallel"], kwargs["detokenize"]) == ("parallel", ("tiny-llama",), "pipeline", False)
    assert isinstance(make_engine(phase[:3], "tiny-llama", "cpu", "float32"), module.LLM)


def test_a_request_that_can_never_fit_is_named_by_its_index(phase, LLM, ParallelLLM, monkeypatch):  # noqa: N803
    """As LLM.generate names it: the router sends each request with its index in the call, and
    the worker that refuses it says which. In this process: the router over a pool whose ranks run
    the worker's run_call on engines of their own (16 blocks of 4 tokens each)."""
    router, worker = (importlib.import_module(f"phases.{phase}.{name}") for name in ("router", "worker"))

    class InProcessPool:
        def __init__(self, model, options, parallel, world_size):
            options = {k: v for k, v in options.items() if k not in ("parallel", "world_size")}
            self.engines = [LLM(model, **options) for _ in range(world_size)]

        def call(self, commands):
            return {rank: worker.run_call(self.engines[rank], payload, lambda: True)
                    for rank, (_, payload) in commands.items()}

    monkeypatch.setattr(router, "WorkerPool", InProcessPool)
    small = dict(device="cpu", dtype="float32", block_size=4, kv_cache_bytes=16 * 4 * 512)   # tiny-llama: 512 B/token
    prompts, params = [[5 + i] * 8 for i in range(4)], [SamplingParams(max_tokens=8, ignore_eos=True)] * 4
    params[2] = SamplingParams(max_tokens=100, ignore_eos=True)                      # 108 tokens: 27 blocks
    refusal = r"^request 2: prompt \+ max_tokens \(108 tokens\) needs 27 KV blocks but the whole pool has 16"
    with pytest.raises(ValueError, match=refusal):
        LLM("tiny-llama", **small).generate(prompts, params)
    for mode in MODES.values():
        with pytest.raises(ValueError, match=refusal):
            ParallelLLM("tiny-llama", **small, **mode).generate(prompts, params)
