"""The phase's bench module: each run puts the previous engine beside this one, on one device."""
import importlib

PHASE = "p05_decode_profiling"
bench = importlib.import_module(f"phases.{PHASE}.bench")


def test_runs_compare_the_previous_engine_with_this_one():
    assert bench.ENGINE == "p05" and bench.PREVIOUS == "p04"
    for run in bench.GPU_RUNS + bench.CPU_RUNS:
        assert run[run.index("--engines") + 1].split(",") == ["p04", "p05"]
        assert "--engine-options" not in run          # one device: no parallel mode
    assert all("--scale" in run and "tiny-llama" in run for run in bench.CPU_RUNS)
