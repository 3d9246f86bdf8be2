"""The phase's bench set: every comparison part carries p13 twice (the A/A control) and p14 on both
GPU backends where both apply; the peer's parts run nano-vllm on both models. And ServedLLM,
inherited: it gives the offline engine's tokens and dies with its parent."""
import importlib
import re
from pathlib import Path

from common import spec_decode
from common.bench import engine_name, parse_engine_options, twin_spec
from common.results import read_records
from tests.suites.served import *  # noqa: F401,F403 - ServedLLM's tests and fixtures, collected here

PHASE = "p14_cuda_graphs"
bench = importlib.import_module(f"phases.{PHASE}.bench")
EngineConfig = importlib.import_module(f"phases.{PHASE}.config").EngineConfig


def engines_of(part) -> list[str]:
    [run] = part
    return run[run.index("--engines") + 1].split(",")


def comparisons():
    for parts in (bench.GPU_PARTS, bench.CPU_PARTS):
        for name, part in parts.items():
            if not callable(part):
                yield name, part


def test_every_comparison_carries_the_aa_control_and_this_engine():
    """A part read beside the peer ("-peer": p14's absolute number, not a ratio over p13) builds
    p14 twice, its own A/A control."""
    for name, part in comparisons():
        engines = engines_of(part)
        if name.endswith("-peer"):
            assert engines == ["p14", "p14#2"], name
            continue
        assert engine_name(engines[0]) == "p13" and engines[1] == twin_spec(engines[0]), name
        assert any(engine_name(e) == "p14" for e in engines), name


def test_the_goals_workloads_on_both_models_and_the_peer_beside_them():
    gpu = bench.GPU_PARTS
    assert {"latency", "latency-8b", "concurrency", "concurrency-8b", "offline", "offline-8b"} <= set(gpu)
    assert gpu["nano-vllm"].preset == "llama-1b" and gpu["nano-vllm-8b"].preset == "llama-8b"
    assert "p14 attention_backend=triton" in engines_of(gpu["latency"])      # our kernel inside the graphs too


def test_every_engine_spec_is_a_valid_config():
    """(The backend is checked where it runs: triton needs a GPU or the interpreter.)"""
    for _, part in comparisons():
        for spec in engines_of(part):
            if engine_name(spec) == "p14":
                options = parse_engine_options(",".join(spec.split()[1:]))
                options.pop("attention_backend", None)
                options.pop("server", None)                 # the harness's, not the engine's
                EngineConfig(model="tiny-llama", device="cpu", **options)


def test_serving_puts_every_engine_behind_its_server():
    """The served path's gain is measured server against server, the A/A twin served too."""
    for name in ("serving", "serving-8b"):
        specs = engines_of(bench.GPU_PARTS[name])
        assert [s.split()[0] for s in specs] == ["p13", "p13#2", "p14"]
        assert all(parse_engine_options(",".join(s.split()[1:]))["server"] == "http" for s in specs)


def test_offline_8b_gives_every_engine_the_same_pool():
    """Three llama-8b engines share one GPU: each gets the same set pool, the twin included."""
    pools = {parse_engine_options(",".join(e.split()[1:])).get("kv_cache_bytes")
             for e in engines_of(bench.GPU_PARTS["offline-8b"])}
    assert pools == {24 << 30}


def test_speculation_runs_the_sweep_with_and_without_graphs():
    part = bench.GPU_PARTS["speculation"]
    assert part.preset == "llama-8b"
    assert part.engines == ["p13", "p13#2", "p13 speculative=ngram", "p14", "p14 speculative=ngram"]


def test_readme_speculation_table_is_generated():
    text = (Path(__file__).resolve().parents[2] / "phases" / PHASE / "README.md").read_text()
    m = re.search(r"<!-- spec-decode:speed -->\n(.*?)\n<!-- /spec-decode:speed -->", text, re.S)
    assert m and m.group(1) == spec_decode.speed_table(read_records(PHASE), PHASE), \
        f"stale: python -m common.spec_decode readme {PHASE}"


def test_profile_pair_profiles_the_step_without_and_with_graphs(tmp_path, monkeypatch):
    """The ablation and the engine in one process, rotated rounds, one run id: a record per
    setting and batch size, told apart by cuda_graph (on a CPU both run eagerly)."""
    import json
    monkeypatch.setattr(importlib.import_module("common.profile_pair"), "RESULTS", tmp_path)
    gpu = bench.GPU_PARTS["profile-pair"]
    assert callable(gpu) and callable(bench.CPU_PARTS["profile-pair"])
    bench.CPU_PARTS["profile-pair"](["--device", "cpu"], "make phase-14 bench PART=profile-pair")
    records = json.loads((tmp_path / PHASE / "profile-pair-cpu.json").read_text())
    assert sorted((r["setting"]["cuda_graph"], r["setting"]["batch"]) for r in records) == \
        [(False, 1), (False, 3), (True, 1), (True, 3)]
    assert {r["engine"] for r in records} == {"p14"} and len({r["run_id"] for r in records}) == 1
    assert all(r["metrics"]["rounds"] == len(r["samples"]) == 2 and r["metrics"]["wall_ms_per_step"] > 0 for r in records)
