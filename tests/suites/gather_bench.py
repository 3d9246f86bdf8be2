"""The phase's bench module: its run lists and the gather-share measurement, on CPU."""
import importlib

import pytest

from common import workloads


@pytest.fixture(scope="module")
def bench(phase):
    return importlib.import_module(f"phases.{phase}.bench")


def engines_of(run: list[str]) -> list[str]:
    return [spec.split()[0] for spec in run[run.index("--engines") + 1].split(",")]


def test_every_part_compares_this_engine_with_the_previous_one_in_one_run(bench):
    """Each comparison run holds this phase's engine and its baseline, so every ratio is same-run."""
    for parts in (bench.GPU_PARTS, bench.CPU_PARTS):
        assert {"latency", "concurrency", "offline", "gather"} <= set(parts)
        for name, part in parts.items():
            for run in ([] if callable(part) else part):
                assert bench.ENGINE in engines_of(run), (name, run)
                levels = run[run.index("--concurrency") + 1] if "--concurrency" in run else "0"
                high = min(int(c) for c in levels.split(",")) >= 32
                serial_only = bench.SERIAL_BEFORE and high            # the serial p01 sits out 32 and 64
                if name in ("latency", "latency-8b", "offline") or name.startswith("concurrency") and not serial_only:
                    assert bench.PREVIOUS in engines_of(run), (name, run)
    assert "hf-static" in engines_of(bench.GPU_PARTS["latency"][0])
    assert {"hf-generate", "hf-generate-nocudnn"} <= set(engines_of(bench.GPU_PARTS["concurrency"][0]))


def test_gather_share_times_a_decode_step(bench, LLM):
    """Two requests in flight: the step's gathers take part of the step, and nothing is left over."""
    llm = LLM("tiny-llama", device="cpu", dtype="float32", cpu_kv_cache_bytes=1 << 22)
    rec = bench.gather_level(llm, 2, "small")
    m = rec["metrics"]
    assert rec["setting"] == {"concurrency": 2} and len(rec["samples"]) == bench.STEPS
    assert 0 < m["gather_ms"] < m["step_ms"] and m["gather_share"] == m["gather_ms"] / m["step_ms"]
    assert m["context_tokens"] == workloads.CONCURRENCY_LENS["small"][0] + bench.STEPS + 1
    assert not llm.has_unfinished()
