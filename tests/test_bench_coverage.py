"""What the GPU bench sets of phases 01-05 measure, taken together: batch-1 latency on the three
GPU presets, and offline and 1/8/32/64 requests in flight on llama-1b and llama-8b, each phase's
engine in every one (p01, a serial engine, has no concurrency workload of its own: p02's parts run
it at 1 and 8 in flight). A part dropped or narrowed to fit a GPU call shows up here."""
import importlib

import pytest

PHASES = ["p01_serial_decode", "p02_paged_kv", "p03_vectorized_gather", "p04_replica_pipeline",
          "p05_decode_profiling"]


def option(run: list[str], name: str) -> str | None:
    return run[run.index(name) + 1] if name in run else None


def measured(phase: str) -> set[tuple]:
    """(workload, preset, concurrency level or None) for every run of the phase's GPU set that
    holds the phase's own engine."""
    bench = importlib.import_module(f"phases.{phase}.bench")
    out = set()
    for part in bench.GPU_PARTS.values():
        for run in ([] if callable(part) else part):
            if bench.ENGINE not in [e.split()[0] for e in option(run, "--engines").split(",")]:
                continue
            levels = option(run, "--concurrency")
            for preset in option(run, "--presets").split(","):
                for level in levels.split(",") if levels else [None]:
                    out.add((option(run, "--workload"), preset, level and int(level)))
    return out


@pytest.mark.parametrize("phase", PHASES)
def test_gpu_bench_set_covers_every_workload_on_every_preset(phase):
    want = {("latency", p, None) for p in ("smollm2-135m-random", "llama-1b", "llama-8b")}
    want |= {("offline", p, None) for p in ("llama-1b", "llama-8b")}
    if phase != "p01_serial_decode":
        want |= {("concurrency", p, c) for p in ("llama-1b", "llama-8b") for c in (1, 8, 32, 64)}
    missing = want - measured(phase)
    assert not missing, f"{phase}'s GPU parts do not measure {sorted(missing, key=str)}"


AA_PHASES = [*PHASES, "p06_paged_attention", "p07_triton_decode", "p08_preemption", "p09_http_serving", "p10_review"]


@pytest.mark.parametrize("phase", AA_PHASES)
def test_every_comparison_carries_its_aa_control(phase):
    """Each comparison run of the phase's GPU and CPU sets builds its baseline (the first engine)
    twice: the second instance, "<spec>#2", is the A/A control its ratios are judged against."""
    from common.bench import twin_spec
    bench = importlib.import_module(f"phases.{phase}.bench")
    for parts in (bench.GPU_PARTS, bench.CPU_PARTS):
        for name, part in parts.items():
            for run in ([] if callable(part) else part):
                engines = option(run, "--engines").split(",")
                assert engines[1] == twin_spec(engines[0]), (phase, name, engines)
