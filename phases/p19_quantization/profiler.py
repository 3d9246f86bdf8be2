"""Profiler: named ranges around the stages of a step, and a profile of N decode steps.

`stage(name)` marks a stage for torch.profiler. It opens a `record_function` range only while a
profiler is recording, so the normal path pays one C call per stage and nothing else. While a
StageClock runs it times the stage on the host instead: the profiler's own bookkeeping about
doubles the host time of a launch-bound step, so the unprofiled split comes from the clock.

`profile_decode` adds B identical requests, prefills them all, warms up, times decode steps
without the profiler, then records a few more under it and reduces the events to a summary per
step: wall time, host (CPU) and GPU kernel time per stage, GPU busy and idle time, kernel
launches, host-device syncs, and the bandwidth floor of the step (weights + KV read once). GPU
busy and idle are measured on the profiled steps, which the profiler lengthens: read them beside
`wall_ms_per_step_profiled` or as `gpu_idle_frac`, never beside the unprofiled `wall_ms_per_step`.
"""
from __future__ import annotations

import gzip
import shutil
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from torch.autograd import DeviceType

from common import roofline, workloads
from common.bench import free_memory
from common.device import default_device, device_name, dtype_name, synchronize
from common.results import device_tag, provenance, trace_name, write_records

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]
STAGES = ("schedule", "prepare inputs", "embedding", "attention", "mlp", "lm_head", "sampling",
          "output handling")
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
SCALAR_READS = ("aten::item", "aten::_local_scalar_dense")
_OFF = nullcontext()
_clock: StageClock | None = None                  # set while clocked_steps() runs


def stage(name: str):
    """A profiler range named `name` while a profiler records, the clock's timer while a clock
    runs, else a shared no-op context."""
    if _clock is not None:
        return _clock.timer(name)
    return torch.profiler.record_function(name) if torch.autograd._profiler_enabled() else _OFF


class StageClock:
    """Host seconds spent inside each stage, summed over the steps it watched. The stages do not
    nest and partition a step, so what they leave is the time outside any stage."""

    def __init__(self):
        self.seconds = dict.fromkeys(STAGES, 0.0)

    @contextmanager
    def timer(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start


def clocked_steps(llm, steps: int) -> dict:
    """`steps` decode steps with the stage clock, no profiler: host ms per stage per step, the
    rest of the step outside the stages, and the clocked wall ms per step."""
    global _clock
    clock = _clock = StageClock()
    try:
        wall = sum(timed_step(llm) for _ in range(steps))
    finally:
        _clock = None
    host = {s: 1e3 * t / steps for s, t in clock.seconds.items()}
    return {"stage_host_ms": host, "host_ms_outside_stages": 1e3 * wall / steps - sum(host.values()),
            "wall_ms_per_step_clocked": 1e3 * wall / steps}


def profile_decode(model: str, batch_sizes: list[int], *, steps: int = 3, timed_steps: int = 10,
                   warmup: int = 3, scale: str = "full", out_dir: Path | None = None,
                   bandwidth: float | None = None, **engine_options) -> list[dict]:
    """Profile `steps` decode steps at each batch size of one engine LLM(model, **engine_options);
    returns one record per batch size and, with out_dir, writes them (profile-<device>.json) with
    a gzipped chrome trace per batch size (trace-<device>-<model>-b<B>.json.gz). engine_options are also
    the record's setting, so the same call profiles an option on and off."""
    from .engine import LLM                       # the engine imports stage() from this module
    check_counts(batch_sizes, steps, timed_steps, warmup)
    if engine_options.get("tensor_parallel_size", 1) != 1:
        raise ValueError("the profile runs one in-process engine: tensor_parallel_size must be 1")
    if bandwidth is None:             # measured before the KV pool takes the free memory
        device = engine_options.get("device") or default_device()
        bandwidth = roofline.copy_bandwidth(device)
        free_memory(device)
    llm = LLM(model, detokenize=False, **engine_options)
    tag = device_tag(device_name(llm.device))
    records = []
    for batch in batch_sizes:
        trace = out_dir / trace_name(device_name(llm.device), model, batch) if out_dir else None
        summary, samples = profile_batch(llm, batch, steps, timed_steps, warmup, scale, bandwidth, trace)
        setting = {"batch": batch} | {k: v for k, v in engine_options.items() if k not in ("device", "dtype")} \
            | {"attention_backend": llm.config.attention_backend}    # the one "auto" resolved to
        records.append(record(llm, model, scale, setting, summary, samples, bandwidth, trace))
        if out_dir:
            write_records(out_dir / f"profile-{tag}.json", records[-1:])
    return records


def check_counts(batch_sizes: list[int], steps: int, timed_steps: int, warmup: int) -> None:
    if not batch_sizes or any(not isinstance(b, int) or b <= 0 for b in batch_sizes):
        raise ValueError(f"batch sizes must be positive integers, got {batch_sizes}")
    if not isinstance(steps, int) or steps <= 0:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    for name, n in (("timed_steps", timed_steps), ("warmup", warmup)):
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {n!r}")


def profile_batch(llm, batch: int, steps: int, timed_steps: int, warmup: int, scale: str,
                  bandwidth: float, trace: Path | None) -> tuple[dict, list[float]]:
    """One batch size on an idle engine: the summary and the unprofiled step times (s)."""
    work = workloads.concurrency(batch, scale)
    check_fits(llm, work, warmup + 2 * timed_steps + steps)
    for ids, params in work.requests:
        llm.add_request(ids, params)
    prefill(llm, batch)
    for _ in range(warmup):
        llm.step()
    samples = [timed_step(llm) for _ in range(timed_steps)]
    clocked = clocked_steps(llm, timed_steps) if timed_steps else {}
    context = sum(seq.num_tokens + steps // 2 for seq in llm.scheduler.running)   # mid-profile KV
    events, wall = record_steps(llm, steps, trace)
    while llm.has_unfinished():                   # leave the engine idle for the next batch size
        llm.step()
    summary = summarize(events, wall, steps, llm.device.startswith("cuda")) | clocked
    summary["wall_ms_per_step"] = 1e3 * sorted(samples)[len(samples) // 2] if samples \
        else summary["wall_ms_per_step_profiled"]
    add_roofline(summary, llm, context, bandwidth)
    return summary, samples


def check_fits(llm, work, decode_steps: int) -> None:
    """All B requests must run at once, and none may finish before the profiled steps end."""
    batch, (prompt, params) = len(work.requests), work.requests[0]
    if decode_steps >= params.max_tokens:
        raise ValueError(f"{decode_steps} decode steps need more than the workload's {params.max_tokens} "
                         f"output tokens; profile fewer steps or use a larger scale")
    blocks = batch * llm.scheduler.block_manager.blocks_for(len(prompt) + params.max_tokens)
    if batch > llm.config.max_num_seqs or blocks > llm.cache.num_blocks:
        raise ValueError(f"batch {batch} does not fit at once: it needs {blocks} KV blocks of "
                         f"{llm.cache.num_blocks} and {batch} seats of max_num_seqs {llm.config.max_num_seqs}")


def prefill(llm, batch: int) -> None:
    """Step until every request runs and has its first token: from here on every step decodes."""
    sched = llm.scheduler
    while sched.waiting or any(not seq.output_ids for seq in sched.running):
        llm.step()
    if len(sched.running) != batch:
        raise RuntimeError(f"{len(sched.running)} of {batch} requests run after prefill")


def timed_step(llm) -> float:
    start = time.perf_counter()
    llm.step()
    synchronize(llm.device)
    return time.perf_counter() - start


def record_steps(llm, steps: int, trace: Path | None):
    """`steps` decode steps under torch.profiler: its events and the wall seconds they took."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if llm.device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:    # no shapes, no stacks: small
        synchronize(llm.device)
        start = time.perf_counter()
        for _ in range(steps):
            llm.step()
        synchronize(llm.device)
        wall = time.perf_counter() - start
    if trace:
        export_trace(prof, trace)
    return prof.events(), wall


def export_trace(prof, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        with raw.open("rb") as src, gzip.open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)


def summarize(events, wall_s: float, steps: int, on_gpu: bool) -> dict:
    """Per decode step, in ms: host time and GPU kernel time per stage, GPU busy/idle, counts."""
    ranges = [e for e in events if e.device_type == DeviceType.CPU and e.name in STAGES]
    kernels = [e for e in events if e.device_type != DeviceType.CPU
               and not getattr(e, "is_user_annotation", False) and e.name not in STAGES]
    launches = [k for k in kernels if not k.name.startswith(("Memcpy", "Memset"))]
    first = min((e.time_range.start for e in ranges), default=0)
    last = max((e.time_range.end for e in ranges), default=0)
    host_ops = [e for e in events if e.device_type == DeviceType.CPU     # the steps' own, not the
                and first <= e.time_range.start <= last]                 # clock's synchronize calls
    per_step = 1e-3 / steps                                     # event us, summed -> ms per step
    cpu = {s: per_step * sum(e.cpu_time_total for e in ranges if e.name == s) for s in STAGES}
    gpu = {s: per_step * sum(_device_us(e) for e in ranges if e.name == s) for s in STAGES}
    busy = per_step * _union_us([(k.time_range.start, k.time_range.end) for k in kernels])
    wall = 1e3 * wall_s / steps
    return {
        "steps": steps, "wall_ms_per_step_profiled": wall,
        "stage_cpu_ms": cpu, "stage_gpu_ms": gpu if on_gpu else {s: 0.0 for s in STAGES},
        "cpu_ms_outside_stages": wall - sum(cpu.values()),
        "gpu_busy_ms": busy, "gpu_idle_ms": wall - busy if on_gpu else 0.0,
        "gpu_idle_frac": 1 - busy / wall if on_gpu else 0.0,    # of the profiled step, same clock
        "kernels_per_step": len(launches) / steps,
        "syncs_per_step": sum(e.name in SYNC_CALLS for e in host_ops) / steps,
        "scalar_reads_per_step": sum(e.name in SCALAR_READS for e in host_ops) / steps,
        "dtoh_copies_per_step": sum(k.name.startswith("Memcpy DtoH") for k in kernels) / steps,
        "htod_copies_per_step": sum(k.name.startswith("Memcpy HtoD") for k in kernels) / steps,
    }


def _device_us(event) -> float:
    """GPU time of the kernels launched inside a range (torch >= 2.4 names; older: cuda_*)."""
    value = getattr(event, "device_time_total", None)
    return value if value is not None else getattr(event, "cuda_time_total", 0.0)


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals: time the GPU ran at least one kernel."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def add_roofline(summary: dict, llm, context_tokens: int, bandwidth: float) -> None:
    """The step's floor: weights (the Linears in 8 bits where quantized) + the KV of all B contexts
    read once at the copy bandwidth, and the gap between it and the unprofiled step."""
    floor_ms = 1e3 * roofline.decode_floor_s(llm.model_config, llm.dtype, context_tokens, bandwidth,
                                             linear_elem=1 if llm.config.quantization else None)
    summary |= {"context_tokens": context_tokens, "bytes_per_step": floor_ms * 1e-3 * bandwidth,
                "ideal_ms_per_step": floor_ms, "gap_ms_per_step": summary["wall_ms_per_step"] - floor_ms,
                "roofline_frac": floor_ms / summary["wall_ms_per_step"]}


def record(llm, preset: str, scale: str, setting: dict, summary: dict, samples: list[float],
           bandwidth: float, trace: Path | None) -> dict:
    """A result record (the schema of common/results.py) of one batch size's profile."""
    name = device_name(llm.device)
    return {"phase": PHASE, "engine": ENGINE, "workload": "profile", "preset": preset,
            "dtype": dtype_name(llm.dtype), "scale": scale, "setting": setting, "device": name,
            "metrics": summary, "samples": [{"step_s": s} for s in samples],
            "hardware": {"copy_bytes_per_s": bandwidth}, "trace": trace.name if trace else None,
            "provenance": provenance(name)}
