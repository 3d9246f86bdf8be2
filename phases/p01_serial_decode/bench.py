"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each part is one or more comparisons run by common.bench: the engines of a comparison are
measured in one process, interleaved and repeated. On a GPU each part fits one 10-minute call;
on a CPU the same comparisons run at --scale small on small presets (common.bench_set).

The serial engine against HF `generate` (eager, and with its static cache compiled), per token at
batch 1, and over a small offline set (a serial engine takes minutes per full set).
"""
from __future__ import annotations

import sys

from common.bench_set import aa, run_parts

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p01"
PEERS = aa(f"hf-generate,{ENGINE},hf-static")              # HF generate twice: the A/A control


def offline(preset: str, scale: tuple = ()) -> list[list[str]]:
    return [["--workload", "offline", *scale, "--presets", preset, "--engines", aa(f"hf-generate,{ENGINE}")]]


SMALL_TWICE = ("--scale", "small", "--repeats", "2")
# Random weights in the real shapes: nothing to carry to the GPU, the same work per token.
GPU_PARTS = {
    "latency": [["--workload", "latency", "--presets", "smollm2-135m-random,llama-1b", "--engines", PEERS]],
    "latency-8b": [["--workload", "latency", "--presets", "llama-8b", "--engines", PEERS]],
    # The engines decode one request at a time: 16 requests took about 5 minutes a round for two on
    # an H200 (llama-1b), so with the A/A twin the offline parts run the first 6 of them (3 on
    # llama-8b, whose tokens take about 1.6 times as long), twice, to fit one 10-minute call.
    "offline": offline("llama-1b", (*SMALL_TWICE, "--requests", "6")),
    "offline-8b": offline("llama-8b", (*SMALL_TWICE, "--requests", "3")),
}
CPU_PARTS = {
    "latency": [["--workload", "latency", "--scale", "small", "--presets", "tiny-llama,smollm2-135m",
                 "--engines", aa(f"hf-generate,{ENGINE}")]],
    "offline": offline("tiny-llama", ("--scale", "small")),
}


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
