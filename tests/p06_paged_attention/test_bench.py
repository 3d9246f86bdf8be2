"""The phase's bench module: each part runs the previous engine and this one with its attention
backends in one run; the CPU set has the torch backend only (flash-attn needs a GPU)."""
import importlib

PHASE = "p06_paged_attention"
bench = importlib.import_module(f"phases.{PHASE}.bench")


def engines(run):
    return run[run.index("--engines") + 1].split(",")


def test_parts_compare_the_previous_engine_with_each_backend_in_one_run():
    assert bench.ENGINE == "p06" and bench.PREVIOUS == "p05"
    for part in [p for p in bench.GPU_PARTS.values() if not callable(p)]:
        assert engines(part[0])[:3] == ["p05", "p06 attention_backend=flash-attn", "p06 attention_backend=torch"]
    for part in bench.CPU_PARTS.values():
        assert engines(part[0]) == ["p05", "p06 attention_backend=torch"] and "tiny-llama" in part[0]


def test_gpu_set_counts_syncs_per_step():
    assert callable(bench.GPU_PARTS["syncs"]) and "syncs" not in bench.CPU_PARTS
