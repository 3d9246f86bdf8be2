"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each part is one comparison run by common.bench: the engines are measured in one process,
interleaved and repeated. On a GPU each part fits one 10-minute call; on a CPU the same
comparison runs at --scale small on tiny-llama.

The engine offline (generate() in this process) against the same engine behind its HTTP server
(a server process, its engine process, requests streamed by common/serving_client.py), with 1 to
64 requests in flight: what the HTTP layer costs, and how the server scales with its clients. The
engine in process is the baseline, built twice (the A/A control).
"""
from __future__ import annotations

import sys

from common.bench_set import aa, run_parts

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p09"
ENGINES = aa(f"{ENGINE},{ENGINE} server=http")


def serving(preset: str, levels: str, *scale: str) -> list[list[str]]:
    return [["--workload", "concurrency", "--concurrency", levels, "--presets", preset, *scale, "--engines", ENGINES]]


GPU_PARTS = {
    "serving": serving("llama-1b", "1,8,32,64"),
    "serving-8b": serving("llama-8b", "1,8,64"),
}
CPU_PARTS = {
    "serving": serving("tiny-llama", "1,8", "--scale", "small"),
}


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
