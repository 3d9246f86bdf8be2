"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each part is one comparison run by common.bench: the engines are measured in one process,
interleaved and repeated. On a GPU each part fits one 10-minute call; on a CPU the same
comparison runs at --scale small on tiny-llama.

The ladder: every phase so far through the same workload in one run, so each step's gain is a
same-run ratio (the records of the phases' own runs are never divided by each other). Every
phase runs with its defaults: p04 in this process (its worker processes are its multi-GPU
lesson), p06 on the "auto" attention backend (FlashAttention 4 on a GPU when installed, else
torch), and so p07 too. This engine also runs beside the previous one: the refactor is meant to
cost nothing.
"""
from __future__ import annotations

import sys

from common.bench_set import run_parts

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p10"
PHASES = [f"p{n:02d}" for n in range(1, int(ENGINE[1:]) + 1)]   # p01 ... this one
# p01 decodes one request at a time: at 64 in flight it would only measure its queue (and take
# minutes per round), so the concurrency ladder starts at p02, the first engine that batches.
BATCHING = PHASES[1:]


def ladder(workload: str, preset: str, engines: list[str], *extra: str) -> list[list[str]]:
    return [["--workload", workload, "--presets", preset, *extra, "--engines", ",".join(engines)]]


GPU_PARTS = {   # llama-1b, bf16; the phases' runs put 11 engines at ~2.5 s a round each, 9 at 3-13 s
    "ladder-latency": ladder("latency", "llama-1b", [*PHASES, "hf-static"]),
    "ladder-concurrency": ladder("concurrency", "llama-1b", BATCHING, "--concurrency", "64"),
}
SMALL = ("--scale", "small", "--repeats", "5")   # a CPU round takes seconds: more repeats, tighter ranges
CPU_PARTS = {   # the HF peer of the earlier phases' CPU parts: hf-generate (hf-static compiles its cache)
    "ladder-latency": ladder("latency", "tiny-llama", [*PHASES, "hf-generate"], *SMALL),
    "ladder-concurrency": ladder("concurrency", "tiny-llama", BATCHING, "--concurrency", "8,32", *SMALL),
}


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
