"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each part is one comparison run by common.bench: the engines are measured in one process,
interleaved and repeated. On a GPU each part fits one 10-minute call; on a CPU the same
comparison runs at --scale small on tiny-llama.

The ladder: every phase so far through the same workload in one run, so each step's gain is a
same-run ratio (the records of the phases' own runs are never divided by each other). Every
phase runs with its defaults: p04 in this process (its worker processes are its multi-GPU
lesson), p06 on the "auto" attention backend (FlashAttention 4 on a GPU when installed, else
torch), p07 on its own Triton kernel (its idea; on "auto" it would run p06's code), and p08 on
from "auto" again. This engine also runs beside the previous one: the refactor is meant to cost
nothing. Every part carries an A/A control (one engine built twice, common.bench_set.aa).

On a GPU the batch-1 ladder is two parts, p01-p05 and p05-p10 (each with HF's compiled static
cache), so that each fits one 10-minute call with its twin; p05 is in both, so that every step
is a same-run ratio of one part, and each part writes a file of its own. "aa-noise" measures the
A/A range itself, p10 against p10, 64 in flight, with the harness's noise control off and then on.
"""
from __future__ import annotations

import sys

from common.bench_set import aa, run_parts

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p10"
PREVIOUS = f"p{int(ENGINE[1:]) - 1:02d}"                    # "p09"
PHASES = [f"p{n:02d}" for n in range(1, int(ENGINE[1:]) + 1)]   # p01 ... this one, on the CPU
# On a GPU p07 runs its own kernel (on "auto" it would run p06's code); on a CPU the kernel runs
# only in Triton's interpreter, which an engine's timing would measure instead.
GPU_PHASES = [{"p07": "p07 attention_backend=triton"}.get(p, p) for p in PHASES]
# p01 decodes one request at a time: at 64 in flight it would only measure its queue (and take
# minutes per round), so the concurrency ladder starts at p02, the first engine that batches.
SPLIT = PHASES.index("p05")                                 # the batch-1 ladder's two halves meet at p05


def ladder(workload: str, preset: str, engines: list[str], *extra: str, base: str | None = None) -> list[list[str]]:
    """One comparison of `engines`, with the A/A twin of `base` (default the first engine)."""
    return [["--workload", workload, "--presets", preset, *extra, "--engines", aa(",".join(engines), base)]]


def aa_noise() -> list[list[str]]:
    """p10 against itself at 64 in flight on llama-1b, six rounds, noise control off and then on:
    the A/A range before and after the harness's noise measures (common.bench), in one call."""
    return [["--workload", "concurrency", "--presets", "llama-1b", "--concurrency", "64", "--repeats", "6",
             "--noise-control", mode, "--file", "aa-noise", "--engines", aa(ENGINE)] for mode in ("off", "on")]


GPU_PARTS = {   # llama-1b, bf16; the phases' runs put 11 engines at ~2.5 s a round each, 9 at 3-13 s
    "ladder-latency-a": ladder("latency", "llama-1b", [*GPU_PHASES[:SPLIT + 1], "hf-static"],
                               "--file", "ladder-latency-a"),
    "ladder-latency-b": ladder("latency", "llama-1b", [*GPU_PHASES[SPLIT:], "hf-static"], "--file", "ladder-latency-b",
                               base=PREVIOUS),
    "ladder-concurrency": ladder("concurrency", "llama-1b", GPU_PHASES[1:], "--concurrency", "64", base=PREVIOUS),
    "aa-noise": aa_noise(),
}
SMALL = ("--scale", "small", "--repeats", "5")   # a CPU round takes seconds: more repeats, tighter ranges
CPU_PARTS = {   # the HF peer of the earlier phases' CPU parts: hf-generate (hf-static compiles its cache)
    "ladder-latency": ladder("latency", "tiny-llama", [*PHASES, "hf-generate"], *SMALL, base=PREVIOUS),
    "ladder-concurrency": ladder("concurrency", "tiny-llama", PHASES[1:], "--concurrency", "8,32", *SMALL,
                                 base=PREVIOUS),
}


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
