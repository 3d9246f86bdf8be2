"""`make phase-NN bench`: this phase's standard benchmark set, through common.bench.

On a GPU: the workloads and presets this phase's claim needs. On a CPU: the same workloads at
--scale small on small presets, so the command always works and always writes a file.
"""
from __future__ import annotations

import sys

import torch

from common import bench

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]   # "p01"

GPU_RUNS = [
    # Random weights in the real shapes: nothing to carry to the GPU, the same work per token.
    ["--workload", "latency", "--presets", "smollm2-135m-random,llama-1b,llama-8b",
     "--engines", f"{ENGINE},hf-generate,hf-generate-nocudnn,hf-static"],
    ["--workload", "offline", "--scale", "small", "--presets", "smollm2-135m-random,llama-1b", "--engines", ENGINE],
]
CPU_RUNS = [
    ["--workload", "latency", "--scale", "small", "--presets", "tiny-llama,smollm2-135m",
     "--engines", f"{ENGINE},hf-generate"],
    ["--workload", "offline", "--scale", "small", "--presets", "tiny-llama", "--engines", ENGINE],
]


def main(argv: list[str]) -> None:
    runs = GPU_RUNS if torch.cuda.is_available() else CPU_RUNS
    for run in runs:
        bench.main(["--phase", PHASE, *run, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
