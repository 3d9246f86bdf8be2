"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each part is one comparison run by common.bench: the engines are measured in one process,
interleaved and repeated. On a GPU each part fits one 10-minute call; on a CPU the same
comparisons run at --scale small on tiny-llama, where only the torch backend exists.

The previous engine (attention over K/V gathered into a padded batch) against this one with
each attention backend: flash-attn reads K/V in place through the block tables, torch is the
exact reference that still gathers. At batch 1 and with 64 requests in flight.
"""
from __future__ import annotations

import sys

from common.bench_set import run_parts

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p06"
PREVIOUS = f"p{int(ENGINE[1:]) - 1:02d}"                    # "p05"
ENGINES = f"{PREVIOUS},{ENGINE} attention_backend=flash-attn,{ENGINE} attention_backend=torch"


def compare(*run: str, engines: str = ENGINES) -> list[list[str]]:
    return [[*run, "--engines", engines]]


GPU_PARTS = {
    "latency": compare("--workload", "latency", "--presets", "llama-1b", engines=f"{ENGINES},hf-static"),
    "latency-8b": compare("--workload", "latency", "--presets", "llama-8b", engines=f"{ENGINES},hf-static"),
    "concurrency": compare("--workload", "concurrency", "--concurrency", "1,64", "--presets", "llama-1b"),
    "concurrency-8b": compare("--workload", "concurrency", "--concurrency", "1,64", "--presets", "llama-8b"),
}
SMALL = ("--scale", "small", "--presets", "tiny-llama")
CPU_ENGINES = f"{PREVIOUS},{ENGINE} attention_backend=torch"
CPU_PARTS = {
    "latency": compare("--workload", "latency", *SMALL, engines=CPU_ENGINES),
    "concurrency": compare("--workload", "concurrency", "--concurrency", "1,8", *SMALL, engines=CPU_ENGINES),
}


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
