"""Decode-step profiles of several engines in one process: a bench part (`PART=profile-pair`).

A phase's own profile (`make phase-NN profile`) runs one engine, and two phases' profiles made on
different machine starts differ by the host's speed, which moves by more than a kernel call's host
cost. Profiled one after the other in one process, on one host, the engines' stage times compare
(a stage whose code did not change, such as the mlp, is the control). Every phase from 05 on has a
profiler.py with the same profile_decode(); the records go to profile-pair-<device>.json.
"""
from __future__ import annotations

import importlib
import uuid

from . import roofline
from .bench import free_memory
from .device import default_device, device_name
from .engines import phase_folder
from .results import RESULTS, device_tag, write_records

# device kind -> (preset, batch sizes, request lengths, dtype)
SHAPES = {"cuda": ("llama-1b", [1, 64], "full", "bfloat16"), "cpu": ("tiny-llama", [1, 3], "small", "float32")}


def profile_part(phase: str, engines: list[tuple[str, dict]]):
    """The part for `phase`'s bench set: engines = [(engine name, engine options), ...], each
    profiled at every batch size of SHAPES, one run id over all of them."""
    def part(argv: list[str], make_command: str) -> None:
        device = argv[argv.index("--device") + 1] if "--device" in argv else default_device()
        preset, batches, scale, dtype = SHAPES["cuda" if device.startswith("cuda") else "cpu"]
        bandwidth = roofline.copy_bandwidth(device)           # once, before any KV pool takes memory
        run = {"run_id": uuid.uuid4().hex[:12], "part": "profile-pair"}
        out = RESULTS / phase / f"profile-pair-{device_tag(device_name(device))}.json"
        for engine, options in engines:
            profiler = importlib.import_module(f"phases.{phase_folder(engine)}.profiler")
            for rec in profiler.profile_decode(preset, batches, scale=scale, bandwidth=bandwidth, device=device,
                                               dtype=dtype, **options):
                rec |= {"phase": phase, "workload": "profile-pair", **run}
                rec["provenance"] |= {"make_command": make_command}
                print_summary(rec, options)
                write_records(out, [rec])
            free_memory(device)
    return part


def print_summary(rec: dict, options: dict) -> None:
    m = rec["metrics"]
    host = {stage: round(ms, 2) for stage, ms in m.get("stage_host_ms", {}).items()}
    print(f"[bench] {rec['engine']} {options or ''} batch {rec['setting']['batch']}: {m['wall_ms_per_step']:.2f} "
          f"ms/step, GPU busy {m.get('gpu_busy_ms', 0):.2f} ms, host ms by stage {host}", flush=True)
