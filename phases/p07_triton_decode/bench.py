"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each part is one comparison run by common.bench: the engines are measured in one process,
interleaved and repeated. On a GPU each part fits one 10-minute call. The kernel itself is checked
and timed by `make phase-NN kernel` (kernel_bench.py), which is also the "kernel" part here.

Our Triton paged decode kernel inside the engine against this same engine on FlashAttention 4
(only the decode kernel differs: the baseline, built twice as the A/A control), and the previous
engine on FlashAttention, at batch 1 and with 64 requests in flight. On a CPU only the kernel's check runs (in Triton's
interpreter): an engine timed in the interpreter would measure the interpreter.
"""
from __future__ import annotations

import sys

from common.bench_set import aa, run_parts

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p07"
PREVIOUS = f"p{int(ENGINE[1:]) - 1:02d}"                    # "p06"
ENGINES = aa(f"{ENGINE} attention_backend=flash-attn,{ENGINE} attention_backend=triton,"
             f"{PREVIOUS} attention_backend=flash-attn")


def compare(*run: str, engines: str = ENGINES) -> list[list[str]]:
    return [[*run, "--engines", engines]]


def kernel(argv: list[str], make_command: str) -> None:
    from .kernel_bench import main as kernel_main          # sets up Triton's interpreter on CPU
    kernel_main(argv, make_command)


GPU_PARTS = {
    "kernel": kernel,
    "latency": compare("--workload", "latency", "--presets", "llama-1b", engines=f"{ENGINES},hf-static"),
    "latency-8b": compare("--workload", "latency", "--presets", "llama-8b", engines=f"{ENGINES},hf-static"),
    "concurrency": compare("--workload", "concurrency", "--concurrency", "1,64", "--presets", "llama-1b"),
    "concurrency-8b": compare("--workload", "concurrency", "--concurrency", "1,64", "--presets", "llama-8b"),
}
CPU_PARTS = {"kernel": kernel}


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
