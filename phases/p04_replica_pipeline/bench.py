"""`make phase-NN bench`: this phase's standard benchmark set, through common.bench.

On GPUs (2 needed): the previous engine on one GPU against this engine as 2 replicas and as a
2-stage pipeline, offline (the standard 256 requests, which one engine holds at once, and 1024,
four times what one engine runs at once) and at fixed concurrency; batch-1 latency of the pipeline
against one GPU. On a CPU: the same comparison at --scale small on tiny-llama, 2 gloo processes. Each
parallel mode reaches the engine through --engine-options and is recorded in the setting.
"""
from __future__ import annotations

import sys

import torch

from common import bench

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p04"
PREVIOUS = f"p{int(ENGINE[1:]) - 1:02d}"                    # "p03": the same engine, one device
MODES = {"replica": "parallel=replica,world_size=2", "pipeline": "parallel=pipeline,world_size=2"}


def compare(*run: str, modes=("replica", "pipeline")) -> list[list[str]]:
    """One run of the previous engine on one device, then one per parallel mode of this engine."""
    return [[*run, "--engines", PREVIOUS]] + [[*run, "--engines", ENGINE, "--engine-options", MODES[m]]
                                              for m in modes]


GPU_RUNS = [
    *compare("--workload", "offline", "--presets", "llama-1b"),
    *compare("--workload", "offline", "--requests", "1024", "--presets", "llama-1b"),
    *compare("--workload", "concurrency", "--concurrency", "1,8,32,64", "--presets", "llama-1b"),
    *compare("--workload", "latency", "--presets", "llama-1b", modes=("pipeline",)),
]
CPU_RUNS = [
    *compare("--workload", "offline", "--scale", "small", "--presets", "tiny-llama"),
    *compare("--workload", "latency", "--scale", "small", "--presets", "tiny-llama", modes=("pipeline",)),
]


def main(argv: list[str]) -> None:
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        raise SystemExit("this phase's benchmark needs 2 GPUs (replicas and pipeline stages)")
    for run in GPU_RUNS if torch.cuda.is_available() else CPU_RUNS:
        bench.main(["--phase", PHASE, *run, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
