"""The phase's bench module: every run compares the previous engine on one device with this one's
parallel modes, and every parallel run hands its mode to the engine."""
import importlib

PHASE = "p04_replica_pipeline"
bench = importlib.import_module(f"phases.{PHASE}.bench")


def engines_and_options(run):
    options = run[run.index("--engine-options") + 1] if "--engine-options" in run else None
    return run[run.index("--engines") + 1], options


def test_runs_compare_one_device_with_both_parallel_modes():
    for runs in (bench.GPU_RUNS, bench.CPU_RUNS):
        pairs = [engines_and_options(run) for run in runs]
        assert (bench.PREVIOUS, None) in pairs
        assert (bench.ENGINE, "parallel=pipeline,world_size=2") in pairs
        assert (bench.ENGINE, "parallel=replica,world_size=2") in pairs
        assert all(options for engine, options in pairs if engine == bench.ENGINE)
    assert bench.ENGINE == "p04" and bench.PREVIOUS == "p03"
