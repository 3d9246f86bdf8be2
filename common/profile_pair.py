"""Decode-step profiles of several engines in one process: a bench part (`PART=profile-pair`).

A phase's own profile (`make phase-NN profile`) runs one engine, and two phases' profiles made on
different machine starts differ by the host's speed, which moves by more than a kernel call's host
cost. Here the engines are profiled in one process, on one host, in rounds whose order rotates
(A B C, B C A, C A B), as common.bench runs its comparisons: the host drifts within a process
too, so one pass in a fixed order is not enough. Each record keeps one sample per round; a stage
time compares per round pair with its range (common.stats), and a stage whose code did not change,
such as the mlp, is the control. Every phase from 05 on has a profiler.py with the same
profile_decode(); the records go to profile-pair-<device>.json.
"""
from __future__ import annotations

import importlib
import statistics
import uuid

from . import roofline, stats
from .bench import free_memory, rotated
from .device import default_device, device_name
from .engines import phase_folder
from .results import RESULTS, device_tag, write_records

# device kind -> (preset, batch sizes, request lengths, dtype, rounds)
SHAPES = {"cuda": ("llama-1b", [1, 64], "full", "bfloat16", 3), "cpu": ("tiny-llama", [1, 3], "small", "float32", 2)}
# the per-stage metrics a round's sample flattens ({"attention": ms, ...} -> "attention_host_ms")
STAGE_METRICS = {"stage_host_ms": "host", "stage_gpu_ms": "gpu"}


def profile_part(phase: str, engines: list[tuple[str, dict]], name: str = "profile-pair",
                 shape: tuple[str, list[int]] | None = None):
    """The part `name` for `phase`'s bench set: engines = [(engine name, engine options), ...], each
    profiled at every batch size of SHAPES in every round, one run id over all of them, one engine
    built at a time. shape (preset, batch sizes): those instead of SHAPES's (a GPU part's llama-8b)."""
    def part(argv: list[str], make_command: str) -> None:
        device = argv[argv.index("--device") + 1] if "--device" in argv else default_device()
        preset, batches, scale, dtype, rounds = SHAPES["cuda" if device.startswith("cuda") else "cpu"]
        preset, batches = shape or (preset, batches)
        bandwidth = roofline.copy_bandwidth(device)           # once, before any KV pool takes memory
        profiled: dict[tuple, list[dict]] = {}                # (engine index, batch) -> a record per round
        for i in range(rounds):
            for k in rotated(list(range(len(engines))), i):
                engine, options = engines[k]
                profiler = importlib.import_module(f"phases.{phase_folder(engine)}.profiler")
                for rec in profiler.profile_decode(preset, batches, scale=scale, bandwidth=bandwidth,
                                                   device=device, dtype=dtype, **options):
                    profiled.setdefault((k, rec["setting"]["batch"]), []).append(rec)
                free_memory(device)
        run = {"workload": "profile-pair", "run_id": uuid.uuid4().hex[:12], "part": name}
        out = RESULTS / phase / f"profile-pair-{device_tag(device_name(device))}.json"
        merged = {}
        for (k, batch), recs in sorted(profiled.items()):
            merged[k, batch] = rec = merge_rounds(recs) | {"phase": phase, **run}
            rec["provenance"] |= {"make_command": make_command}
            print_summary(rec, engines[k][1])
            write_records(out, [rec])
        print_ratios(merged, engines)
    return part


def merge_rounds(recs: list[dict]) -> dict:
    """One record from an engine's per-round profiles of one batch size: a sample per round (its
    numbers, stage times flattened), metrics the medians (stage dicts stage by stage)."""
    samples = [{"repeat": i, **flat_metrics(r["metrics"])} for i, r in enumerate(recs)]
    metrics = {}
    for key, value in recs[0]["metrics"].items():
        if isinstance(value, dict):
            metrics[key] = {s: statistics.median(r["metrics"][key][s] for r in recs) for s in value}
        elif isinstance(value, (int, float)):
            metrics[key] = statistics.median(r["metrics"][key] for r in recs)
    return recs[0] | {"metrics": metrics | {"rounds": len(recs)}, "samples": samples}


def flat_metrics(metrics: dict) -> dict:
    flat = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    for key, clock in STAGE_METRICS.items():
        flat |= {f"{stage}_{clock}_ms": ms for stage, ms in metrics.get(key, {}).items()}
    return flat


# stage times a reader compares between engines: the attention stage changes, the mlp is the control
COMPARED = ("wall_ms_per_step", "gpu_busy_ms", "attention_gpu_ms", "attention_host_ms", "mlp_gpu_ms", "mlp_host_ms")


def print_ratios(merged: dict, engines: list[tuple[str, dict]]) -> None:
    """Every engine against the first, per round pair (above 1: the engine spends less time)."""
    for (k, batch), rec in merged.items():
        if k == 0:
            continue
        ratios = {key: stats.format_ratio(stats.paired_ratio(rec, merged[0, batch], key), show_aa=False)
                  for key in COMPARED}           # the mlp, whose code did not change, is this part's control
        print(f"[bench]   {rec['engine']} {engines[k][1] or ''} vs {engines[0][0]} {engines[0][1] or ''} batch {batch}: "
              f"{ratios}", flush=True)


def print_summary(rec: dict, options: dict) -> None:
    m = rec["metrics"]
    host = {stage: round(ms, 2) for stage, ms in m.get("stage_host_ms", {}).items()}
    print(f"[bench] {rec['engine']} {options or ''} batch {rec['setting']['batch']}: {m['wall_ms_per_step']:.2f} "
          f"ms/step, GPU busy {m.get('gpu_busy_ms', 0):.2f} ms, host ms by stage {host} "
          f"(medians of {m['rounds']} rounds)", flush=True)
