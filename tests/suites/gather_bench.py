"""The phase's bench module: its run lists and the gather-share measurement, on CPU."""
import importlib

import pytest

from common import workloads


@pytest.fixture(scope="module")
def bench(phase):
    return importlib.import_module(f"phases.{phase}.bench")


def test_runs_name_this_phase_and_its_peers(bench):
    for run in bench.GPU_RUNS + bench.CPU_RUNS:
        assert bench.ENGINE in run[run.index("--engines") + 1].split(",")
    assert bench.device_and_dtype(["--device", "cpu", "--presets", "x"]) == ("cpu", "float32")


def test_gather_share_times_a_decode_step(bench, LLM):
    """Two requests in flight: the step's gathers take part of the step, and nothing is left over."""
    llm = LLM("tiny-llama", device="cpu", dtype="float32", cpu_kv_cache_bytes=1 << 22)
    rec = bench.gather_level(llm, 2, "small")
    m = rec["metrics"]
    assert rec["setting"] == {"concurrency": 2} and len(rec["samples"]) == bench.STEPS
    assert 0 < m["gather_ms"] < m["step_ms"] and m["gather_share"] == m["gather_ms"] / m["step_ms"]
    assert m["context_tokens"] == workloads.CONCURRENCY_LENS["small"][0] + bench.STEPS + 1
    assert not llm.has_unfinished()
