"""The phase's bench module: each part runs the previous engine, this one and this one with its
idea switched off (lean_step=0) in one run, on one device."""
import importlib

PHASE = "p05_decode_profiling"
bench = importlib.import_module(f"phases.{PHASE}.bench")


def test_parts_compare_the_previous_engine_with_this_one_in_one_run():
    assert bench.ENGINE == "p05" and bench.PREVIOUS == "p04"
    for parts in (bench.GPU_PARTS, bench.CPU_PARTS):
        for run in [run for part in parts.values() for run in part]:
            engines = run[run.index("--engines") + 1].split(",")
            assert engines[:3] == ["p04", "p05", "p05 lean_step=0"]
            assert "--engine-options" not in run          # one device: no parallel mode
    assert all("--scale" in run and "tiny-llama" in run for part in bench.CPU_PARTS.values() for run in part)
