"""The phase's bench module: every part compares the previous engine on one device with this
one's parallel modes in one run, each mode handed to the engine through its engine spec."""
import importlib

PHASE = "p04_replica_pipeline"
bench = importlib.import_module(f"phases.{PHASE}.bench")


def test_parts_compare_one_device_with_the_parallel_modes_in_one_run():
    assert bench.ENGINE == "p04" and bench.PREVIOUS == "p03"
    for parts in (bench.GPU_PARTS, bench.CPU_PARTS):
        for name, part in parts.items():
            for run in part:
                engines = run[run.index("--engines") + 1].split(",")
                assert engines[0] == "p03" and "p04 parallel=pipeline world_size=2" in engines
                if not name.startswith("latency"):      # batch 1 has nothing to spread over replicas
                    assert "p04 parallel=replica world_size=2" in engines
