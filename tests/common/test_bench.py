"""The bench harness on CPU: a --scale small run writes valid records with provenance."""
from __future__ import annotations

import json

import pytest
import torch

from common import bench, roofline, workloads
from common.loader import resolve

REQUIRED = {"phase", "engine", "workload", "preset", "dtype", "scale", "setting", "device",
            "metrics", "samples", "provenance", "hardware"}
PROVENANCE = {"command", "git_sha", "torch", "triton", "transformers", "cuda", "utc", "device"}


def run(tmp_path, *args) -> list[dict]:
    out = tmp_path / "result.json"
    bench.main(["--phase", "p01_serial_decode", "--scale", "small", "--out", str(out), *args])
    return json.loads(out.read_text())


def test_latency_small_writes_valid_records(tmp_path):
    """p01 and hf-generate side by side: one record each, every field the design asks for."""
    records = run(tmp_path, "--workload", "latency", "--presets", "tiny-llama", "--engines", "p01,hf-generate")
    assert [r["engine"] for r in records] == ["p01", "hf-generate"]
    for rec in records:
        assert REQUIRED <= set(rec) and PROVENANCE <= set(rec["provenance"])
        m = rec["metrics"]
        assert m["decode_tok_s"] > 0 and m["ms_per_token"] == pytest.approx(1e3 / m["decode_tok_s"])
        assert 0 < m["roofline_ms_per_token"] and m["roofline_frac"] > 0
        assert len(rec["samples"]) == workloads.LATENCY_REPEATS["small"]
        assert all(s["num_tokens"] == 256 for s in rec["samples"])
        assert rec["device"] == "cpu" and rec["dtype"] == "float32"


def test_offline_small_counts_every_token(tmp_path):
    work = workloads.offline("small")
    [rec] = run(tmp_path, "--workload", "offline", "--presets", "tiny-llama", "--engines", "p01")
    m = rec["metrics"]
    assert m["num_requests"] == workloads.OFFLINE_REQUESTS["small"] == len(work.requests)
    assert m["output_tokens"] == work.output_tokens and m["prompt_tokens"] == work.prompt_tokens
    assert m["output_tok_s"] == pytest.approx(m["output_tokens"] / m["wall_s"])


def test_rerun_replaces_record_with_same_key(tmp_path):
    run(tmp_path, "--workload", "latency", "--presets", "tiny-llama", "--engines", "p01", "--repeats", "1")
    records = run(tmp_path, "--workload", "latency", "--presets", "tiny-llama", "--engines", "p01", "--repeats", "1")
    assert len(records) == 1


def test_workloads_follow_the_protocol():
    lat = workloads.latency()
    assert len(lat.requests) == 1 and len(lat.prompts[0]) == 32 and lat.params[0].max_tokens == 256
    off = workloads.offline("full")
    assert len(off.requests) == 256
    assert all(100 <= len(p) <= 1024 for p in off.prompts)
    assert all(100 <= p.max_tokens <= 1024 and p.ignore_eos and p.greedy for p in off.params)
    assert workloads.offline("full").prompts == off.prompts          # seeded


def test_decode_floor_is_bytes_over_bandwidth():
    cfg = resolve("llama-1b").config
    bw = 4e12
    floor = roofline.decode_floor_s(cfg, torch.bfloat16, context_tokens=1000, bandwidth=bw)
    expected = (cfg.num_params() * 2 + 1000 * 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2) / bw
    assert floor == pytest.approx(expected)


def test_unknown_engine_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="unknown engine"):
        run(tmp_path, "--workload", "latency", "--presets", "tiny-llama", "--engines", "p99")


def test_concurrency_runs_each_level_with_identical_lengths(tmp_path):
    """One record per (engine, level); the HF baseline pads the c requests into one batch."""
    records = run(tmp_path, "--workload", "concurrency", "--concurrency", "1,3", "--presets", "tiny-llama",
                  "--engines", "p01,hf-generate")
    assert [(r["engine"], r["setting"]) for r in records] == [
        ("p01", {"concurrency": 1}), ("p01", {"concurrency": 3}),
        ("hf-generate", {"concurrency": 1}), ("hf-generate", {"concurrency": 3})]
    prompt_len, max_tokens = workloads.CONCURRENCY_LENS["small"]
    for rec in records:
        m, c = rec["metrics"], rec["setting"]["concurrency"]
        assert m["num_requests"] == c and m["output_tokens"] == c * max_tokens
        assert m["prompt_tokens"] == c * prompt_len and m["itl_ms_p50"] > 0


def test_concurrency_workload_is_seeded_and_nested():
    eight = workloads.concurrency(8)
    assert len(eight.requests) == 8
    assert {len(p) for p in eight.prompts} == {512} and {p.max_tokens for p in eight.params} == {256}
    assert all(p.ignore_eos and p.greedy for p in eight.params)
    assert workloads.concurrency(1).prompts == eight.prompts[:1]     # every level, the same prompts


def test_engine_options_reach_phase_engines_and_the_setting(tmp_path):
    """--engine-options builds the phase engine with them and records them; HF takes none."""
    records = run(tmp_path, "--workload", "concurrency", "--concurrency", "1", "--presets", "tiny-llama",
                  "--engines", "p03,hf-generate", "--engine-options", "max_num_seqs=4,block_size=8")
    assert [(r["engine"], r["setting"]) for r in records] == [
        ("p03", {"concurrency": 1, "max_num_seqs": 4, "block_size": 8}), ("hf-generate", {"concurrency": 1})]
    assert bench.parse_engine_options("parallel=replica,world_size=2") == {"parallel": "replica", "world_size": 2}
    with pytest.raises(SystemExit):
        run(tmp_path, "--workload", "latency", "--presets", "tiny-llama", "--engines", "p03", "--engine-options", "x")


def test_offline_requests_sets_the_size_and_the_setting(tmp_path):
    """--requests N: N requests from the same seeded stream (the standard set is its prefix),
    recorded in the setting so it never replaces the standard-size record."""
    assert workloads.offline("full", num_requests=300).prompts[:256] == workloads.offline("full").prompts
    [rec] = run(tmp_path, "--workload", "offline", "--presets", "tiny-llama", "--engines", "p03", "--requests", "20")
    assert rec["setting"] == {"requests": 20} and rec["metrics"]["num_requests"] == 20
    with pytest.raises(SystemExit):
        run(tmp_path, "--workload", "latency", "--presets", "tiny-llama", "--engines", "p03", "--requests", "4")


def test_offline_warm_up_reaches_every_replica():
    """The warm-up sends several requests, and p04's router gives two of them to two replicas."""
    from phases.p04_replica_pipeline.router import least_outstanding_tokens

    class Recorder:
        def __init__(self):
            self.calls = []

        def generate(self, prompts, params, use_tqdm=False):
            self.calls.append(len(prompts))
            return [type("Out", (), {"token_ids": [0] * p.max_tokens, "ttft": 0.0, "itl": []})() for p in params]

    work, engine = workloads.offline("small"), Recorder()
    bench.offline_metrics(engine, work, "cpu")
    assert engine.calls == [bench.WARMUP_REQUESTS, len(work.requests)]
    costs = [len(p) + 8 for p in work.prompts[:bench.WARMUP_REQUESTS]]
    assert all(least_outstanding_tokens(costs, 2))          # neither replica is left cold
