"""One sample: one engine, one workload, once. The harness (bench.py) repeats and interleaves these.

Also what an engine needs to share the device with the others of a comparison: a KV budget sized
for the workload (no more than it can fill), and the memory its run takes.
"""
from __future__ import annotations

import time

import torch

from . import workloads
from .device import synchronize
from .loader import resolve

MAX_IN_FLIGHT = 256          # the engines' default max_num_seqs: more requests than this queue
WARMUP_TOKENS = 8            # new tokens per request in the warm-up's short version of a workload


def cold_cache(engine) -> None:
    """Empty an engine's prefix cache (phase 12 on) before a sample: the rounds repeat the same
    prompts, and a round that read the previous round's blocks would time a cached prefill, not the
    workload's. (The shared-prefix workload measures the cache itself: common/shared_prefix.py.)"""
    reset = getattr(engine, "reset_prefix_cache", None)
    if callable(reset):
        reset()


def latency_sample(engine, work, device: str) -> dict:
    """One batch-1 run: prefill time and steady decode tok/s from the per-token times."""
    cold_cache(engine)
    synchronize(device)
    out = engine.generate(work.prompts, work.params)[0]
    t = out.token_times
    decode = (len(t) - 1) / (t[-1] - t[0])
    return {"decode_tok_s": decode, "ms_per_token": 1e3 / decode,
            "prefill_ms": 1e3 * (t[0] - out.arrival_time), "num_tokens": len(out.token_ids)}


def throughput_sample(engine, work, device: str) -> dict:
    """Every request of the workload submitted at once: tokens per second of the whole set."""
    before = memory_allocated(device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    preempted = preemptions(engine)
    cold_cache(engine)
    synchronize(device)
    start = time.perf_counter()
    outs = engine.generate(work.prompts, work.params)
    synchronize(device)
    wall = time.perf_counter() - start
    out_tokens = sum(len(o.token_ids) for o in outs)
    if out_tokens != work.output_tokens:
        raise RuntimeError(f"engine produced {out_tokens} tokens, workload asked for {work.output_tokens}")
    sample = {"output_tok_s": out_tokens / wall, "total_tok_s": (out_tokens + work.prompt_tokens) / wall,
              "requests_per_s": len(outs) / wall, "wall_s": wall,
              "ttft_s_p50": sorted(o.ttft for o in outs)[len(outs) // 2]}
    # Little's law: the requests decoding at a time, on average, is the sum of their decode spans
    # (first to last token) over the wall time. Engine-agnostic: it needs only the token times.
    sample["mean_in_flight"] = sum(o.token_times[-1] - o.token_times[0] for o in outs if o.token_times) / wall
    itls = sorted(x for o in outs for x in o.itl)
    if itls:   # with every request in flight, one inter-token latency is one decode step
        sample["itl_ms_p50"] = 1e3 * itls[len(itls) // 2]
    if device.startswith("cuda"):   # what this run added on top of what was resident before it
        sample["run_peak_gib"] = (torch.cuda.max_memory_allocated() - before) / 2**30
    if preempted is not None:       # an engine that preempts (phase 08 on): how often, in this sample
        sample["num_preemptions"] = preemptions(engine) - preempted
    return sample


def preemptions(engine) -> int | None:
    """The engine's running count of preemptions (its scheduler's num_preemptions), or None for an
    engine without one."""
    count = getattr(getattr(engine, "scheduler", None), "num_preemptions", None)
    return count if isinstance(count, int) else None


def short_version(work) -> workloads.Workload:
    """The workload's own requests, each cut to WARMUP_TOKENS new tokens: the same prompts, so the
    same prefill shapes, batch sizes and prefix-cache contents as a timed round, at a fraction of
    its decode steps (the workload is already scaled: --scale small warms small)."""
    return workloads.Workload(work.name, [(ids, workloads.greedy(min(p.max_tokens, WARMUP_TOKENS)))
                                          for ids, p in work.requests])


def warm_up(engine, work) -> None:
    """Run the clock's workload in short before the clock starts, so that round 0 is no cold start.

    Its short version twice. The first run compiles and allocates for the batch sizes and prompt
    shapes the clock sees (a kernel library may compile a variant per batch size: FlashAttention
    4's first round at 64 in flight once took 1.7x the later ones), gives every replica of a
    router its share, and leaves the prefix cache as a timed round leaves it: every prompt of the
    workload, since a prompt left out is one that round 0 prefills and the later rounds read from
    the cache. The second run meets the cache hits every timed round meets: a prompt whose prefix
    is cached runs other shapes (a short chunk over a long cached context), and where the clock
    met them first, round 0 compiled them (p13 behind its server took 4.3 s to its first token at
    1 in flight in round 0, 0.02 s in the rounds after). An engine without a prefix cache runs the
    same shapes twice. A workload of one request (batch 1) then runs once in full: every context
    length it reaches decoded before the clock (a compiled engine compiles for its shapes)."""
    short = short_version(work)
    for _ in range(2):
        engine.generate(short.prompts, short.params)
    if len(work.requests) == 1:
        engine.generate(work.prompts, work.params)


def kv_budget_bytes(preset: str, dtype: torch.dtype, works: list, block_size: int = 16) -> int:
    """Bytes of KV cache the largest of `works` can fill: every request it holds at once
    (the MAX_IN_FLIGHT longest), each rounded up to whole blocks, plus one block each of slack."""
    per_token = resolve(preset).config.kv_bytes_per_token(dtype)
    most = 0
    for work in works:
        blocks = sorted((-(-(len(ids) + p.max_tokens) // block_size) + 1 for ids, p in work.requests), reverse=True)
        most = max(most, sum(blocks[:MAX_IN_FLIGHT]) * block_size)
    return most * per_token


def memory_allocated(device: str) -> int:
    return torch.cuda.memory_allocated() if device.startswith("cuda") else 0
