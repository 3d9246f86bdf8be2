"""`make phase-NN bench`: this phase's standard benchmark set, through common.bench.

The profile is this phase's product (`make phase-NN profile`); the benchmark measures what came
of it: the previous engine on one device against this one (the lean step: fused RMSNorm, key mask
made once per step), and this one with lean_step=0, whose difference from the previous engine is
the price of the stage ranges while no profiler records (nothing, if they are right). At batch 1
and at fixed concurrency; on a CPU the same at --scale small on tiny-llama.
"""
from __future__ import annotations

import sys

import torch

from common import bench

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p05"
PREVIOUS = f"p{int(ENGINE[1:]) - 1:02d}"                    # "p04", on one device: no ranges at all
ENGINES = ("--engines", f"{PREVIOUS},{ENGINE}")

GPU_RUNS = [
    ["--workload", "latency", "--presets", "llama-1b", *ENGINES],
    ["--workload", "concurrency", "--concurrency", "1,64", "--presets", "llama-1b", *ENGINES],
]
CPU_RUNS = [
    ["--workload", "latency", "--scale", "small", "--presets", "tiny-llama", *ENGINES],
    ["--workload", "concurrency", "--concurrency", "1,8", "--scale", "small", "--presets", "tiny-llama", *ENGINES],
]


def main(argv: list[str]) -> None:
    for run in GPU_RUNS if torch.cuda.is_available() else CPU_RUNS:
        bench.main(["--phase", PHASE, *run, *argv])
        bench.main(["--phase", PHASE, *run[:-1], ENGINE, "--engine-options", "lean_step=0", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
