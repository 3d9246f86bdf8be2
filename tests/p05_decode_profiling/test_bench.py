"""The phase's bench module: each part runs the previous engine, this one and this one with its
idea switched off (lean_step=0) in one run, on one device."""
import importlib
import json

PHASE = "p05_decode_profiling"
bench = importlib.import_module(f"phases.{PHASE}.bench")


def test_parts_compare_the_previous_engine_with_this_one_in_one_run():
    assert bench.ENGINE == "p05" and bench.PREVIOUS == "p04"
    for parts in (bench.GPU_PARTS, bench.CPU_PARTS):
        for run in [run for part in parts.values() if not callable(part) for run in part]:
            engines = run[run.index("--engines") + 1].split(",")
            assert engines[:4] == ["p04", "p04#2", "p05", "p05 lean_step=0"]
            assert "--engine-options" not in run          # one device: no parallel mode
    assert all("--scale" in run and "tiny-llama" in run
               for part in bench.CPU_PARTS.values() if not callable(part) for run in part)


def test_profile_pair_profiles_the_step_without_and_with_the_fixes(tmp_path, monkeypatch):
    """lean_step=0 and lean_step=1 profiled in one process, in rotated rounds: one run id, a record
    per setting and batch size with a sample per round, named by the make command."""
    monkeypatch.setattr(importlib.import_module("common.profile_pair"), "RESULTS", tmp_path)
    bench.CPU_PARTS["profile-pair"](["--device", "cpu"], "make phase-05 bench PART=profile-pair")
    records = json.loads((tmp_path / PHASE / "profile-pair-cpu.json").read_text())
    assert sorted((r["setting"]["lean_step"], r["setting"]["batch"]) for r in records) == [(0, 1), (0, 3), (1, 1), (1, 3)]
    assert {r["engine"] for r in records} == {"p05"} and len({r["run_id"] for r in records}) == 1
    for r in records:
        assert r["provenance"]["make_command"] == "make phase-05 bench PART=profile-pair"
        assert r["metrics"]["rounds"] == len(r["samples"]) == 2 and r["metrics"]["wall_ms_per_step"] > 0
    assert bench.GPU_PARTS["profile-pair"] is bench.CPU_PARTS["profile-pair"]
