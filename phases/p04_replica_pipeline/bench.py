"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each part is one comparison run by common.bench: the engines are measured in one process,
interleaved and repeated. On GPUs (2 needed) each part fits one 10-minute call; on a CPU the same
comparisons run at --scale small on tiny-llama, 2 gloo processes (common.bench_set).

The previous engine on one device against this engine as 2 replicas and as a 2-stage pipeline:
offline (the standard 256 requests, which one engine holds at once; 1024, four times that; on
llama-8b the first 128, to fit one call), at fixed concurrency, and the pipeline's batch-1 latency.
"""
from __future__ import annotations

import sys

import torch

from common.bench_set import aa, run_parts

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p04"
PREVIOUS = f"p{int(ENGINE[1:]) - 1:02d}"                    # "p03": the same engine, one device
MODES = {"replica": f"{ENGINE} parallel=replica world_size=2", "pipeline": f"{ENGINE} parallel=pipeline world_size=2"}
ALL = aa(",".join([PREVIOUS, *MODES.values()]))          # the previous engine twice: the A/A control


def compare(*run: str, engines: str = ALL) -> list[list[str]]:
    return [[*run, "--engines", engines]]


GPU_PARTS = {
    "offline": compare("--workload", "offline", "--presets", "llama-1b"),
    "offline-1024": compare("--workload", "offline", "--requests", "1024", "--repeats", "2", "--presets", "llama-1b"),
    "offline-8b": compare("--workload", "offline", "--requests", "128", "--presets", "llama-8b"),
    "concurrency": compare("--workload", "concurrency", "--concurrency", "1,8,32,64", "--presets", "llama-1b"),
    "concurrency-8b": compare("--workload", "concurrency", "--concurrency", "1,8,32,64", "--presets", "llama-8b"),
    "latency": compare("--workload", "latency", "--presets", "smollm2-135m-random,llama-1b",
                       engines=aa(f"{PREVIOUS},{MODES['pipeline']},hf-static")),
    "latency-8b": compare("--workload", "latency", "--presets", "llama-8b",
                          engines=aa(f"{PREVIOUS},{MODES['pipeline']},hf-static")),
}
SMALL = ("--scale", "small", "--presets", "tiny-llama")
CPU_PARTS = {
    "offline": compare("--workload", "offline", *SMALL),
    "latency": compare("--workload", "latency", *SMALL, engines=aa(f"{PREVIOUS},{MODES['pipeline']}")),
}


def main(argv: list[str]) -> None:
    if torch.cuda.is_available() and "cpu" not in argv and torch.cuda.device_count() < 2:
        raise SystemExit("this phase's benchmark needs 2 GPUs (replicas and pipeline stages); "
                         "`make phase-04 bench ARGS='--device cpu'` runs the CPU set")
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
