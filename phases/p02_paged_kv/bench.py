"""`make phase-NN bench`: this phase's standard benchmark set, through common.bench.

On a GPU: the workloads and presets this phase's claim needs. On a CPU: the same workloads at
--scale small on small presets, so the command always works and always writes a file.
Besides common's workloads, "gather" measures the KV gather's share of a decode step.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from common import bench, workloads
from common.device import default_device, default_dtype, device_name, synchronize
from common.engines import make_engine
from common.results import RESULTS, device_tag, provenance, write_records
from common.sampling import SamplingParams

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p02"
UP_TO_HERE = [f"p{n:02d}" for n in range(1, int(ENGINE[1:]) + 1)]
BATCHED = ",".join(UP_TO_HERE[1:])                          # every engine since batching began
ALL = ",".join(UP_TO_HERE)

GPU_RUNS = [
    ["--workload", "latency", "--presets", "smollm2-135m-random,llama-1b", "--engines", ENGINE],
    ["--workload", "offline", "--presets", "llama-1b", "--engines", BATCHED],
    ["--workload", "offline", "--scale", "small", "--presets", "llama-1b", "--engines", f"p01,{ENGINE}"],
    ["--workload", "concurrency", "--concurrency", "1,8,32,64", "--presets", "llama-1b,smollm2-135m-random",
     "--engines", f"{ALL},hf-generate,hf-generate-nocudnn"],
]
CPU_RUNS = [
    ["--workload", "latency", "--scale", "small", "--presets", "tiny-llama", "--engines", ENGINE],
    ["--workload", "offline", "--scale", "small", "--presets", "tiny-llama", "--engines", f"p01,{ENGINE}"],
    ["--workload", "concurrency", "--scale", "small", "--concurrency", "1,8,32", "--presets", "tiny-llama",
     "--engines", f"{ALL},hf-generate"],
]
GATHER = {"cuda": ("llama-1b", (1, 8, 32, 64), "full"), "cpu": ("tiny-llama", (1, 8, 32), "small")}
STEPS = 20                                                  # decode steps timed per level


def timed(fn, device: str) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def gather_level(llm, c: int, scale: str) -> dict:
    """c requests of the concurrency workload in flight: a whole decode step vs the step's
    2 x num_layers KV gathers alone (same sequences, same metadata), median of STEPS each."""
    params = SamplingParams(temperature=0, max_tokens=STEPS + 3, ignore_eos=True)
    for ids in workloads.concurrency(c, scale).prompts:
        llm.add_request(ids, params)
    while llm.scheduler.waiting or not all(s.output_ids for s in llm.scheduler.running):
        llm.step()                                          # prefill everyone
    steps = [timed(llm.step, llm.device) for _ in range(STEPS)]
    seqs, _ = llm.scheduler.schedule()                      # the next decode step, not run yet
    _, ctx = llm.runner.prepare_decode(seqs)
    layers = range(llm.model_config.num_layers)
    gathers = [timed(lambda: [llm.cache.gather(i, ctx) for i in layers], llm.device) for _ in range(STEPS)]
    while llm.has_unfinished():
        llm.step()
    step_ms, gather_ms = 1e3 * statistics.median(steps), 1e3 * statistics.median(gathers)
    return {"setting": {"concurrency": c}, "samples": [{"step_s": s, "gather_s": g} for s, g in zip(steps, gathers)],
            "metrics": {"step_ms": step_ms, "gather_ms": gather_ms, "gather_share": gather_ms / step_ms,
                        "context_tokens": max(ctx.context_lens)}}


def gather_share(device: str, dtype: str) -> None:
    preset, levels, scale = GATHER["cuda" if device.startswith("cuda") else "cpu"]
    llm = make_engine(ENGINE, preset, device, dtype)
    name = device_name(device)
    out = RESULTS / PHASE / f"gather-{device_tag(name)}.json"
    for c in levels:
        rec = {"phase": PHASE, "engine": ENGINE, "workload": "gather", "preset": preset, "dtype": dtype,
               "scale": scale, "device": name, **gather_level(llm, c, scale), "provenance": provenance(name)}
        m = rec["metrics"]
        print(f"[bench] {ENGINE} gather C={c:<3} {preset} {dtype} {name}: step {m['step_ms']:.2f} ms, "
              f"gathers {m['gather_ms']:.2f} ms ({100 * m['gather_share']:.0f}%)", flush=True)
        write_records(out, [rec])


def main(argv: list[str]) -> None:
    runs = GPU_RUNS if torch.cuda.is_available() else CPU_RUNS
    for run in runs:
        bench.main(["--phase", PHASE, *run, *argv])
    gather_share(*device_and_dtype(argv))


def device_and_dtype(argv: list[str]) -> tuple[str, str]:
    """--device and --dtype among the extra arguments, with common.bench's defaults."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--device")
    p.add_argument("--dtype")
    args, _ = p.parse_known_args(argv)
    device = args.device or default_device()
    return device, args.dtype or default_dtype(device)


if __name__ == "__main__":
    main(sys.argv[1:])
