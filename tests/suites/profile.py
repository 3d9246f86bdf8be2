"""The profile mode on CPU: a summary with every stage and sane numbers, a gzipped chrome trace
that names the stages, the same tokens with and without a profiler, ranges that cost nothing
while no profiler records, and clear errors for bad arguments. (The GPU arithmetic of the
summary is checked on hand-made events.)"""
import dataclasses
import gzip
import importlib
import json
import re
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from common.sampling import SamplingParams


@pytest.fixture(scope="module")
def profiler(phase):
    return importlib.import_module(f"phases.{phase}.profiler")


OPTIONS = dict(device="cpu", dtype="float32", block_size=4, cpu_kv_cache_bytes=1 << 22)
STEPS, TIMED = 2, 3


@pytest.fixture(scope="module")
def profiled(tmp_path_factory, profiler):
    out = tmp_path_factory.mktemp("profile")
    records = profiler.profile_decode("tiny-llama", [1, 3], steps=STEPS, timed_steps=TIMED, warmup=1,
                                      scale="small", out_dir=out, **OPTIONS)
    return out, records


def test_summary_has_every_stage_and_sane_numbers(profiled, profiler, phase):
    out, records = profiled
    assert json.loads((out / "profile-cpu.json").read_text()) == records
    # engine options are part of the setting (the same call profiles an option on and off)
    # from phase 06 on, the attention backend "auto" resolved to is named too
    backend = {"attention_backend": "torch"} if phase >= "p06" else {}
    assert [r["setting"] for r in records] == [{"batch": b, "block_size": 4, "cpu_kv_cache_bytes": 1 << 22} | backend
                                               for b in (1, 3)]
    for rec in records:
        m = rec["metrics"]
        assert (rec["workload"], rec["engine"], rec["device"], rec["preset"]) == ("profile", phase[:3], "cpu", "tiny-llama")
        assert m["steps"] == STEPS and len(rec["samples"]) == TIMED
        assert set(m["stage_cpu_ms"]) == set(m["stage_gpu_ms"]) == set(profiler.STAGES)
        assert all(t > 0 for t in m["stage_cpu_ms"].values())
        assert sum(m["stage_cpu_ms"].values()) <= m["wall_ms_per_step_profiled"]
        assert m["cpu_ms_outside_stages"] >= 0
        assert m["wall_ms_per_step"] > 0 and m["ideal_ms_per_step"] > 0
        assert m["gap_ms_per_step"] == pytest.approx(m["wall_ms_per_step"] - m["ideal_ms_per_step"])
        assert m["gpu_busy_ms"] == m["gpu_idle_ms"] == m["kernels_per_step"] == m["syncs_per_step"] == 0
        assert rec["hardware"]["copy_bytes_per_s"] > 0 and rec["provenance"]["git_sha"]
        # the stage clock, no profiler: every stage timed, together no more than the clocked step
        assert set(m["stage_host_ms"]) == set(profiler.STAGES) and all(t > 0 for t in m["stage_host_ms"].values())
        assert m["host_ms_outside_stages"] >= 0
        assert sum(m["stage_host_ms"].values()) + m["host_ms_outside_stages"] == pytest.approx(m["wall_ms_per_step_clocked"])
    assert profiler._clock is None                              # the clock is off again
    # the KV of three contexts is read on top of the same weights
    assert records[1]["metrics"]["bytes_per_step"] > records[0]["metrics"]["bytes_per_step"]


def test_trace_is_gzipped_json_naming_every_stage(profiled, profiler):
    out, records = profiled
    for rec in records:
        path = out / rec["trace"]
        assert path.name == f"trace-cpu-tiny-llama-b{rec['setting']['batch']}.json.gz"
        assert path.stat().st_size < 300_000
        names = {e.get("name") for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]}
        assert set(profiler.STAGES) <= names


def test_profiling_does_not_change_tokens(prompts_for, LLM, profiler):
    llm = LLM("tiny-llama", **OPTIONS)
    prompts = prompts_for("tiny-llama")[:3]
    params = [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
              SamplingParams(temperature=0.8, top_p=0.9, max_tokens=12, seed=5, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)]
    plain = llm.generate(prompts, params)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        traced = llm.generate(prompts, params)
    assert [o.token_ids for o in traced] == [o.token_ids for o in plain]
    assert set(profiler.STAGES) <= {e.name for e in prof.events()}


def test_stages_are_no_ops_without_a_profiler(monkeypatch, prompts_for, LLM, profiler):
    def boom(name):
        raise AssertionError(f"record_function({name!r}) called with no profiler recording")
    llm = LLM("tiny-llama", **OPTIONS)
    monkeypatch.setattr(torch.profiler, "record_function", boom)
    assert profiler.stage("attention") is profiler.stage("mlp")      # one shared nullcontext
    out = llm.generate(prompts_for("tiny-llama")[:2], SamplingParams(temperature=0, max_tokens=4))
    assert [len(o.token_ids) for o in out] == [4, 4]


def test_gpu_summary_arithmetic_on_hand_made_events(profiler):
    """Kernel time per stage from the range events, busy time as a union of kernel intervals
    (overlaps once), GPU range annotations and copies not counted as kernels, and only the syncs
    that happen between the first and the last stage."""
    def event(name, device=DeviceType.CPU, cpu=0.0, gpu=0.0, span=(0.0, 0.0), annotation=False):
        return SimpleNamespace(name=name, device_type=device, cpu_time_total=cpu, device_time_total=gpu,
                               time_range=SimpleNamespace(start=span[0], end=span[1]),
                               is_user_annotation=annotation)
    events = [event("attention", cpu=100, gpu=50, span=(0, 100), annotation=True),
              event("mlp", cpu=30, gpu=40, span=(100, 130), annotation=True),
              event("attention", DeviceType.CUDA, span=(0, 200), annotation=True),
              event("gemm", DeviceType.CUDA, span=(0, 50)), event("gemm", DeviceType.CUDA, span=(40, 90)),
              event("Memcpy DtoH (Device -> Pageable)", DeviceType.CUDA, span=(100, 101)),
              event("cudaStreamSynchronize", span=(120, 125)), event("aten::item", span=(10, 11)),
              event("aten::_local_scalar_dense", span=(10, 11)),
              event("cudaDeviceSynchronize", span=(150, 160))]        # the clock's, after the last stage
    s = profiler.summarize(events, wall_s=400e-6, steps=2, on_gpu=True)
    assert s["wall_ms_per_step_profiled"] == pytest.approx(0.2)
    assert s["stage_gpu_ms"]["attention"] == pytest.approx(0.025)
    assert s["stage_cpu_ms"]["mlp"] == pytest.approx(0.015)
    assert s["gpu_busy_ms"] == pytest.approx(0.0455)
    assert s["gpu_idle_ms"] == pytest.approx(0.2 - 0.0455)
    assert s["gpu_idle_frac"] == pytest.approx(1 - 0.0455 / 0.2)     # of the profiled step
    assert (s["kernels_per_step"], s["syncs_per_step"], s["scalar_reads_per_step"], s["dtoh_copies_per_step"]) \
        == (1, 0.5, 1, 0.5)


@pytest.mark.parametrize("kwargs,message", [
    (dict(batch_sizes=[0]), "batch sizes must be positive"),
    (dict(batch_sizes=[]), "batch sizes must be positive"),
    (dict(steps=0), "steps must be a positive integer"),
    (dict(steps=40), "decode steps need more than"),
])
def test_bad_arguments_are_clear_errors(kwargs, message, profiler):
    args = dict(batch_sizes=[1], scale="small", bandwidth=1e9, **OPTIONS) | kwargs
    with pytest.raises(ValueError, match=message):
        profiler.profile_decode("tiny-llama", **args)


@pytest.mark.parametrize("args,message", [
    (["--batch", "0"], "batch sizes must be positive"),
    (["--batch", "1,x"], "--batch takes comma-separated integers"),
    (["--steps", "0"], "steps must be a positive integer"),
])
def test_cli_bad_profile_arguments(args, message, tmp_path, cli):
    with pytest.raises(SystemExit, match=message):
        cli.main(["--profile", "--device", "cpu", "--out", str(tmp_path), *args])


def test_profile_refuses_more_than_one_process(profiler, cli, phase, tmp_path):
    """The profile times one in-process engine: worker processes (p04-p15's replicas and pipeline)
    or tensor-parallel ranks (p16 on) are refused, in the API and on the command line."""
    config = importlib.import_module(f"phases.{phase}.config").EngineConfig
    if "tensor_parallel_size" in {f.name for f in dataclasses.fields(config)}:
        options, flag, message = dict(tensor_parallel_size=2), ["--tensor-parallel-size", "2"], "tensor_parallel_size must be 1"
    else:
        options, flag, message = dict(parallel="replica", world_size=2), ["--parallel", "replica"], "parallel must be 'none'"
    with pytest.raises(ValueError, match=message):
        profiler.profile_decode("tiny-llama", batch_sizes=[1], scale="small", bandwidth=1e9, **OPTIONS, **options)
    with pytest.raises(SystemExit, match=f"drop {flag[0]}"):
        cli.main(["--profile", "--device", "cpu", "--out", str(tmp_path), *flag])


def test_cli_profile_writes_summary_and_trace(capsys, tmp_path, cli):
    cli.main(["--profile", "--device", "cpu", "--batch", "2", "--steps", "2", "--timed-steps", "2",
              "--out", str(tmp_path)])
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("[profile] tiny-llama batch 2 on cpu")
    # GPU idle is measured on the profiled steps: printed beside their wall, not the unprofiled one
    assert re.search(r"under the profiler \d+\.\d\d ms/step, GPU idle \d+% of it$", line), line
    assert {p.name for p in tmp_path.iterdir()} == {"profile-cpu.json", "trace-cpu-tiny-llama-b2.json.gz"}
