"""The bench harness on CPU: a --scale small run writes valid records with provenance, measured
interleaved and repeated in one run, with KV pools sized for the workload."""
from __future__ import annotations

import json

import pytest
import torch

from common import bench, measure, roofline, stats, workloads
from common.loader import resolve

REQUIRED = {"phase", "engine", "workload", "preset", "dtype", "scale", "setting", "device", "run_id", "part",
            "repeats", "metrics", "spread", "samples", "provenance", "hardware"}
PROVENANCE = {"command", "git_sha", "torch", "triton", "transformers", "cuda", "utc", "device"}


@pytest.fixture(scope="module", autouse=True)
def hardware_measured_once():
    """The host's copy bandwidth and matmul rate (roofline.measure, a second of copies and matrix
    products per bench run), measured by the module's first run and reused by the others: these
    tests check what a record holds and how runs are put together, not the host's numbers."""
    measured = {}

    def once(device):
        if device not in measured:
            measured[device] = real(device)
        return measured[device]
    real = roofline.measure
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(roofline, "measure", once)
        yield


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
        assert len(rec["samples"]) == rec["repeats"] == workloads.REPEATS["latency"]["small"]
        assert [s["repeat"] for s in rec["samples"]] == list(range(rec["repeats"]))
        assert all(s["num_tokens"] == 256 for s in rec["samples"])
        lo, hi = rec["spread"]["decode_tok_s"]
        assert lo <= m["decode_tok_s"] <= hi and m["floor_bytes"] > 0
        assert rec["device"] == "cpu" and rec["dtype"] == "float32"
    assert records[0]["run_id"] == records[1]["run_id"]             # one comparison, one run


def test_rerun_replaces_record_with_same_key(tmp_path):
    """(The smallest workload: a record's key does not depend on it.)"""
    one = ("--workload", "concurrency", "--concurrency", "1", "--presets", "tiny-llama", "--engines", "p01",
           "--repeats", "1")
    first = run(tmp_path, *one)
    records = run(tmp_path, *one)
    assert len(records) == 1 and records[0]["run_id"] != first[0]["run_id"]


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
    linears = cfg.num_layers * (cfg.hidden_size * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
                                + 3 * cfg.hidden_size * cfg.intermediate_size)
    int8 = roofline.decode_floor_s(cfg, torch.bfloat16, context_tokens=1000, bandwidth=bw, linear_elem=1)
    assert int8 == pytest.approx(expected - linears / bw)          # the Linears' weights: 1 byte, not 2


def test_unknown_engine_is_a_clear_error_before_measuring(tmp_path, capsys):
    with pytest.raises(SystemExit):
        run(tmp_path, "--workload", "latency", "--presets", "tiny-llama", "--engines", "p99")
    assert "unknown engine" in capsys.readouterr().err and not (tmp_path / "result.json").exists()


@pytest.mark.parametrize("kind", ["directory", "not a list"])
def test_bad_out_path_is_refused_before_measuring(tmp_path, kind):
    """(A file that is not JSON at all is moved aside instead: test_a_corrupt_out_file_...)"""
    out = tmp_path / "out.json"
    if kind == "directory":
        out.mkdir()
    else:
        out.write_text('{"a": 1}')
    with pytest.raises(SystemExit, match="--out"):
        bench.main(["--phase", "p01_serial_decode", "--workload", "latency", "--presets", "tiny-llama",
                    "--engines", "p01", "--out", str(out)])


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


def test_long_prompts_are_another_setting(tmp_path, capsys):
    """--prompt-len replaces the prompt length (not the output's) and goes into the setting, so the
    report keeps long-context rows apart from the standard ones; it takes the concurrency and the
    latency workload (batch 1 over a long context), not offline's (its lengths are its own)."""
    records = run(tmp_path, "--workload", "concurrency", "--concurrency", "2", "--prompt-len", "100",
                  "--presets", "tiny-llama", "--engines", "p01", "--repeats", "1")
    _, max_tokens = workloads.CONCURRENCY_LENS["small"]
    assert [r["setting"] for r in records] == [{"concurrency": 2, "prompt_len": 100}]
    assert records[0]["metrics"]["prompt_tokens"] == 200 and records[0]["metrics"]["output_tokens"] == 2 * max_tokens
    assert workloads.concurrency(2, prompt_len=100).prompts[0][:8] == workloads.concurrency(2).prompts[0][:8]
    (tmp_path / "latency").mkdir()
    latency = run(tmp_path / "latency", "--workload", "latency", "--prompt-len", "100", "--presets", "tiny-llama",
                  "--engines", "p01", "--repeats", "1", "--scale", "small")
    assert [r["setting"] for r in latency] == [{"batch": 1, "prompt_len": 100}]
    for bad in (["--workload", "offline", "--prompt-len", "100"], ["--workload", "concurrency", "--prompt-len", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(["--phase", "p01_serial_decode", "--engines", "p01", *bad])
        assert "--prompt-len takes a positive length" in capsys.readouterr().err


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
    recorded in the setting so it never replaces the standard-size record. The record counts every
    token, on a batching engine (p10: a serial one takes ten times as long to decode them); four
    requests, not the small scale's 16 (its ~9000 new tokens count alike, at 13 s on a CPU)."""
    assert workloads.offline("full", num_requests=300).prompts[:256] == workloads.offline("full").prompts
    assert len(workloads.offline("small").requests) == workloads.OFFLINE_REQUESTS["small"]
    work = workloads.offline("small", num_requests=4)
    [rec] = run(tmp_path, "--workload", "offline", "--presets", "tiny-llama", "--engines", "p10", "--requests", "4",
                "--repeats", "1")
    m = rec["metrics"]
    assert rec["setting"] == {"requests": 4} and m["num_requests"] == 4
    assert m["output_tokens"] == work.output_tokens and m["prompt_tokens"] == work.prompt_tokens
    for sample in rec["samples"]:
        assert sample["output_tok_s"] == pytest.approx(m["output_tokens"] / sample["wall_s"])
        assert 1 < sample["mean_in_flight"] <= len(work.requests)    # every request submitted at once
    with pytest.raises(SystemExit):
        run(tmp_path, "--workload", "latency", "--presets", "tiny-llama", "--engines", "p03", "--requests", "4")


class Recorder:
    """An engine that records the prompts and new-token budgets of every generate() call."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append((list(prompts), [p.max_tokens for p in params]))
        return [type("Out", (), {"token_ids": [0] * p.max_tokens, "ttft": 0.0, "itl": [], "token_times": [0.0, 1e-3]})()
                for p in params]


@pytest.mark.parametrize("work", [workloads.offline("small"), workloads.concurrency(24, "small")], ids=["offline", "c=24"])
def test_warm_up_runs_the_workload_in_short_twice(work):
    """Every request of the workload (the batch the clock sees), WARMUP_TOKENS new tokens each,
    twice: the first run as a timed round leaves the prefix cache, the second meeting its hits."""
    engine = Recorder()
    measure.warm_up(engine, work)
    short = (work.prompts, [min(p.max_tokens, measure.WARMUP_TOKENS) for p in work.params])
    assert engine.calls == [short, short] and set(short[1]) == {measure.WARMUP_TOKENS}


def test_latency_warm_up_then_runs_the_request_in_full():
    """One request: in short twice, then once in full (every context length the clock decodes)."""
    work, engine = workloads.latency(), Recorder()
    measure.warm_up(engine, work)
    assert engine.calls == [(work.prompts, [measure.WARMUP_TOKENS])] * 2 + [(work.prompts, [256])]


def test_offline_warm_up_reaches_every_replica():
    """p04's router gives the warm-up's requests to both replicas (one request would warm one)."""
    from phases.p04_replica_pipeline.router import least_outstanding_tokens

    work, engine = workloads.offline("small"), Recorder()
    measure.warm_up(engine, work)
    measure.throughput_sample(engine, work, "cpu")
    assert [len(prompts) for prompts, _ in engine.calls] == [len(work.requests)] * 3
    costs = [len(p) + measure.WARMUP_TOKENS for p in work.prompts]
    assert all(least_outstanding_tokens(costs, 2))          # neither replica is left cold


def cached_prompt_tokens(engine, work) -> int:
    """One round of `work` through the step API: the prompt tokens its requests read from the
    prefix cache."""
    ids = {engine.add_request(prompt, params) for prompt, params in work.requests}
    seqs = [seq for seq in engine.scheduler.waiting if seq.seq_id in ids]
    while engine.has_unfinished():
        engine.step()
    return sum(seq.num_cached_tokens or 0 for seq in seqs)


def test_round_0_meets_the_prefix_cache_the_later_rounds_meet():
    """With prefix caching (phase 12 on) a timed round reads its prompts from the cache the round
    before it left. The warm-up leaves the cache as a round leaves it, so round 0 reads what the
    rounds after it read (a warm-up of the first 8 requests left round 0 to prefill the others)."""
    from phases.p12_prefix_caching import LLM

    work = workloads.Workload("offline", [(prompt, workloads.greedy(16)) for prompt in
                                          workloads.offline("small", num_requests=10).prompts])
    engine = LLM("tiny-llama", device="cpu", kv_cache_bytes=measure.kv_budget_bytes("tiny-llama", torch.float32, [work]))
    measure.warm_up(engine, work)
    rounds = [cached_prompt_tokens(engine, work) for _ in range(2)]
    assert rounds[0] == rounds[1] > 0.9 * work.prompt_tokens


def test_engines_are_interleaved_round_by_round(tmp_path, monkeypatch):
    """Round i runs every engine on every setting before round i+1 starts, the engines' order
    rotated each round (A B, B A, ...)."""
    order = []
    real = bench.take_sample

    def spy(engine, work, device):
        order.append((type(engine).__module__.split(".")[-2 if "phases" in type(engine).__module__ else 1],
                      len(work.requests)))
        return real(engine, work, device)
    monkeypatch.setattr(bench, "take_sample", spy)
    run(tmp_path, "--workload", "concurrency", "--concurrency", "1,2", "--presets", "tiny-llama",
        "--engines", "p02,p03", "--repeats", "2")
    engines = [e for e, _ in order]
    a, b = "p02_paged_kv", "p03_vectorized_gather"
    assert engines == [a, b, a, b, b, a, b, a]
    assert [c for _, c in order] == [1, 1, 2, 2, 1, 1, 2, 2]


def test_each_round_rotates_the_engines_order():
    assert [bench.rotated(["A", "B", "C"], i) for i in range(4)] == \
        [["A", "B", "C"], ["B", "C", "A"], ["C", "A", "B"], ["A", "B", "C"]]


def test_per_repeat_ratios_come_from_one_run(tmp_path):
    """Two engines of one run pair up by repeat; records of two runs give no ratio. Each record
    names the attention backend "auto" resolved to (FlashAttention only where it imports: a GPU
    run without it would otherwise measure another engine under the same name); p03 has none.
    Noise control off: its collections before every sample change no pairing."""
    a, b = run(tmp_path, "--workload", "latency", "--presets", "tiny-llama", "--engines", "p03,p06",
               "--noise-control", "off")
    assert b["engine_facts"]["attention_backend"] == "torch" and "engine_facts" not in a
    r = stats.paired_ratio(b, a, "decode_tok_s")
    assert r["pairs"] == 2 and r["min"] <= r["median"] <= r["max"]
    expected = [s["decode_tok_s"] / t["decode_tok_s"] for s, t in zip(b["samples"], a["samples"])]
    assert r["min"] == pytest.approx(min(expected)) and r["max"] == pytest.approx(max(expected))
    assert stats.paired_ratio(b, a | {"run_id": "another"}, "decode_tok_s") is None
    slower = stats.paired_ratio(b, a, "ms_per_token")       # lower is better: still "b's gain over a"
    assert slower["median"] == pytest.approx(r["median"], rel=1e-9)


def test_every_time_in_ms_is_lower_is_better():
    for key in ("ms_per_token", "itl_ms_p50", "gpu_busy_ms", "attention_host_ms", "step_ms"):
        assert not stats.higher_is_better(key), key
    for key in ("decode_tok_s", "output_tok_s", "gather_share", "roofline_frac"):
        assert stats.higher_is_better(key), key


def test_a_ratio_needs_a_range_to_be_a_gain():
    """One repeat pair has no range: it is reported as such and counts as noise, however far from 1."""
    one = {"median": 1.19, "min": 1.19, "max": 1.19, "pairs": 1}
    assert stats.within_noise(one) and stats.format_ratio(one) == "1.19× (1 pair, no range) noise; no A/A"
    three = {"median": 1.19, "min": 1.10, "max": 1.30, "pairs": 3}
    assert not stats.within_noise(three) and stats.format_ratio(three) == "1.19× (1.10–1.30); no A/A"
    assert stats.format_ratio(three | {"min": 0.95}) == "1.19× (0.95–1.30) noise; no A/A"


def test_kv_pool_is_sized_for_the_workload():
    """Every request the workload holds at once, in whole blocks plus one spare each, and no more."""
    work = workloads.concurrency(3, "small")
    per_token = resolve("tiny-llama").config.kv_bytes_per_token(torch.float32)
    prompt, out = workloads.CONCURRENCY_LENS["small"]
    blocks = -(-(prompt + out) // 16) + 1
    assert measure.kv_budget_bytes("tiny-llama", torch.float32, [work]) == 3 * blocks * 16 * per_token
    many = workloads.offline("full", num_requests=300)      # more than run at once: the longest 256 count
    assert measure.kv_budget_bytes("tiny-llama", torch.float32, [many]) < \
        sum(-(-(len(i) + p.max_tokens) // 16) + 1 for i, p in many.requests) * 16 * per_token


def test_phase_engines_get_the_sized_pool_and_hf_does_not(tmp_path):
    args = bench.parse_args(["--phase", "x", "--workload", "latency", "--engines", "p01,p03,hf-generate",
                             "--device", "cpu"])
    works = bench.make_workloads(args)
    assert "kv_cache_bytes" not in bench.sized_options("p01", "tiny-llama", args, works)   # no paged pool
    assert bench.sized_options("p03", "tiny-llama", args, works)["kv_cache_bytes"] > 0
    assert bench.sized_options("hf-generate", "tiny-llama", args, works) == {}
    spec = bench.sized_options("p04 parallel=replica world_size=2", "tiny-llama", args, works)
    assert spec["parallel"] == "replica" and spec["world_size"] == 2


def test_a_part_names_its_make_command_in_every_record(tmp_path, capsys):
    """make phase-NN bench PART=x runs the part's comparisons; each record says which command made it."""
    from common import bench_set
    out = tmp_path / "r.json"
    parts = {"small": [["--workload", "concurrency", "--concurrency", "1", "--presets", "tiny-llama", "--engines",
                        "p01", "--repeats", "1", "--out", str(out)]]}
    bench_set.run_parts("p01_serial_decode", parts, parts, ["--part", "small", "--device", "cpu"])
    [rec] = json.loads(out.read_text())
    assert rec["part"] == "small" and rec["provenance"]["make_command"] == "make phase-01 bench PART=small"
    with pytest.raises(SystemExit, match="no part 'nope'.*parts: small"):
        bench_set.run_parts("p01_serial_decode", parts, parts, ["--part", "nope"])


def test_a_corrupt_out_file_is_moved_aside_before_measuring(tmp_path, capsys):
    out = tmp_path / "result.json"
    out.write_text('[{"engine": "p01"')                       # a write cut short
    bench.check_out(out)
    assert not out.exists() and "moved it to" in capsys.readouterr().err
    assert [p.name.split(".corrupt-")[0] for p in tmp_path.iterdir()] == ["result.json"]


def test_aa_twin_is_a_second_instance_and_every_record_carries_its_range(tmp_path):
    """"p01#2" builds p01 a second time; its records keep the suffix, and every record of the
    setting carries the twin-over-baseline ratio ("aa") on the workload's main metric."""
    records = run(tmp_path, "--workload", "latency", "--presets", "tiny-llama", "--engines", "p01,p01#2,hf-generate",
                  "--noise-control", "off")
    assert [r["engine"] for r in records] == ["p01", "p01#2", "hf-generate"]
    assert bench.engine_name("p01#2 lean_step=0") == "p01" and bench.instance_name("p01#2 x=1") == "p01#2"
    assert bench.twin_spec("p06 attention_backend=torch") == "p06#2 attention_backend=torch"
    expected = stats.paired_ratio(records[1], records[0], "decode_tok_s")
    for rec in records:
        assert rec["aa"] == expected | {"metric": "decode_tok_s", "engine": "p01"}
        assert rec["setting"] == {"batch": 1, "noise_control": "off"}
    assert "A/A control" in "\n".join(bench.ratio_lines(records))
    assert "A/A " in bench.standard_line(records[2])


def test_quiet_gc_freezes_and_restores():
    import gc
    with bench.quiet_gc(True):
        assert not gc.isenabled() and gc.get_freeze_count() > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0
    with bench.quiet_gc(False):
        assert gc.isenabled()


def test_throughput_sample_counts_the_preemptions_of_its_own_run():
    """An engine whose scheduler counts preemptions (phase 08 on): the sample holds the count of
    its own run, not the running total; an engine without the counter gets no such field."""
    class Scheduler:
        num_preemptions = 5

    class Engine:
        scheduler = Scheduler()

        def generate(self, prompts, params):
            self.scheduler.num_preemptions += 3
            return [type("Out", (), {"token_ids": [0] * p.max_tokens, "ttft": 0.1, "itl": [], "token_times": [0.0, 1.0]})()
                    for p in params]
    work = workloads.concurrency(2, "small")
    assert measure.throughput_sample(Engine(), work, "cpu")["num_preemptions"] == 3
    assert measure.preemptions(object()) is None


def test_aa_puts_the_baseline_and_its_twin_first():
    from common.bench_set import aa
    assert aa("p05,p06,hf-static") == "p05,p05#2,p06,hf-static"
    assert aa("p06 attention_backend=torch,p05", base="p05") == "p05,p05#2,p06 attention_backend=torch"
    with pytest.raises(ValueError, match="not among"):
        aa("p05,p06", base="p04")


def test_pinning_applies_on_a_gpu_host_only_and_is_undone(monkeypatch):
    import os
    before = os.sched_getaffinity(0)
    with bench.pinned_cores(True, "cpu") as cores:
        assert cores is None                     # a CPU run keeps every core
    with bench.pinned_cores(True, "cuda") as cores:
        assert os.sched_getaffinity(0) == set(cores) and len(cores) <= bench.PIN_CORES
    assert os.sched_getaffinity(0) == before

    def refuse(*args):
        raise OSError("not permitted")
    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    with bench.pinned_cores(True, "cuda") as cores:
        assert cores is None                     # refused: measured unpinned, not a crash


def test_a_gpu_engine_whose_auto_is_not_flash_attention_is_named(capsys):
    """A GPU without FlashAttention: "auto" falls back, and the run says so before any number."""
    from types import SimpleNamespace

    def engine(backend):
        return SimpleNamespace(runner=SimpleNamespace(backend=SimpleNamespace(name=backend)))
    bench.warn_if_auto_fell_back("p14", engine("triton"), "cuda")
    assert "p14 runs attention on triton: FlashAttention is not installed" in capsys.readouterr().err
    for name, eng, device in (("p14", engine("flash-attn"), "cuda"), ("p06", engine("torch"), "cpu"),
                              ("p06 attention_backend=torch", engine("torch"), "cuda"), ("p03", object(), "cuda")):
        bench.warn_if_auto_fell_back(name, eng, device)
    assert capsys.readouterr().err == ""
