"""The phase's bench module: a pool too small for the load, the previous engine (worst-case
reservation) against this one in both preemption modes, in one run."""
import importlib

PHASE = "p08_preemption"
bench = importlib.import_module(f"phases.{PHASE}.bench")


def test_parts_compare_reservation_with_both_preemption_modes_on_one_small_pool():
    for parts in (bench.GPU_PARTS, bench.CPU_PARTS):
        [run] = parts["offline-small-kv"]
        engines = run[run.index("--engines") + 1].split(",")
        pools = {spec.split()[1] for spec in engines}
        assert len(pools) == 1 and next(iter(pools)).startswith("kv_cache_bytes=")
        assert [e.split()[0] for e in engines] == ["p07", "p07#2", "p08", "p08"]
        assert {e.split()[-1] for e in engines[2:]} == {"preemption=recompute", "preemption=swap"}
