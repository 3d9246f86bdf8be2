"""The phase's bench module: each part runs the previous engine and this one with its attention
backends in one run; the CPU set has the torch backend only (flash-attn needs a GPU)."""
import importlib
import json
import statistics

from common import stats
from common.bench import twin_spec

PHASE = "p06_paged_attention"
bench = importlib.import_module(f"phases.{PHASE}.bench")


def engines(run):
    return run[run.index("--engines") + 1].split(",")


def test_parts_compare_the_previous_engine_with_each_backend_in_one_run():
    assert bench.ENGINE == "p06" and bench.PREVIOUS == "p05"
    flash, torch_ = "p06 attention_backend=flash-attn", "p06 attention_backend=torch"
    for name, part in [(n, p) for n, p in bench.GPU_PARTS.items() if not callable(p)]:
        if name.startswith("concurrency-long"):       # reading in place vs gathering: a backend is the baseline
            assert sorted(engines(part[0])) == sorted(["p05", flash, torch_, engines(part[0])[1]])
            assert engines(part[0])[1] == twin_spec(engines(part[0])[0])
        else:
            assert engines(part[0])[:4] == ["p05", "p05#2", flash, torch_]
    assert engines(bench.GPU_PARTS["concurrency-long"][0])[:2] == [torch_, "p06#2 attention_backend=torch"]
    for part in [p for p in bench.CPU_PARTS.values() if not callable(p)]:
        assert engines(part[0]) == ["p05", "p05#2", torch_] and "tiny-llama" in part[0]


def test_long_context_part_runs_64_in_flight_at_4k_and_8k():
    """Both long runs stay inside llama-1b's 8192 positions with the standard 256 output tokens."""
    runs = [bench.GPU_PARTS[name][0] for name in ("concurrency-long", "concurrency-long-8k")]
    lens = [int(run[run.index("--prompt-len") + 1]) for run in runs]
    assert lens == [3840, 7936] and max(lens) + 256 <= 8192
    assert all(run[run.index("--concurrency") + 1] == "64" and "llama-1b" in run for run in runs)
    assert "--prompt-len" in bench.CPU_PARTS["concurrency-long"][0]


def test_gpu_set_counts_syncs_per_step():
    assert callable(bench.GPU_PARTS["syncs"]) and "syncs" not in bench.CPU_PARTS


def test_profile_pair_profiles_both_phases_in_one_run(tmp_path, monkeypatch):
    """p05's decode step and p06's (each backend the device has) profiled in one process, in
    rotated rounds: one run id, a record per engine and batch size with a sample per round, every
    stage clocked on the host, and stage times that compare per round pair."""
    monkeypatch.setattr(importlib.import_module("common.profile_pair"), "RESULTS", tmp_path)
    bench.CPU_PARTS["profile-pair"](["--device", "cpu"], "make phase-06 bench PART=profile-pair")
    records = json.loads((tmp_path / PHASE / "profile-pair-cpu.json").read_text())
    assert sorted((r["engine"], r["setting"]["batch"]) for r in records) == [("p05", 1), ("p05", 3), ("p06", 1), ("p06", 3)]
    assert len({r["run_id"] for r in records}) == 1 and {r["workload"] for r in records} == {"profile-pair"}
    assert all(r["setting"]["attention_backend"] == "torch" for r in records if r["engine"] == "p06")
    for r in records:
        m = r["metrics"]
        assert m["wall_ms_per_step"] > 0 and m["stage_host_ms"]["attention"] > 0 and m["stage_host_ms"]["mlp"] > 0
        assert r["provenance"]["make_command"] == "make phase-06 bench PART=profile-pair"
        assert m["rounds"] == len(r["samples"]) == 2 and [s["repeat"] for s in r["samples"]] == [0, 1]
        assert m["stage_host_ms"]["mlp"] == statistics.median(s["mlp_host_ms"] for s in r["samples"])
    mine = {(r["engine"], r["setting"]["batch"]): r for r in records}
    attention = stats.paired_ratio(mine["p06", 3], mine["p05", 3], "attention_host_ms")
    assert attention["pairs"] == 2 and attention["min"] > 0
