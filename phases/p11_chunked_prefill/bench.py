"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each part is one comparison, the engines measured in one process, interleaved and repeated, the
previous phase built twice ("p10", "p10#2": the run's A/A control). On a GPU each part fits one
10-minute call; on a CPU the same comparison runs at small scale on tiny-llama.

long-mix (common/long_mix.py): steady decode streams and Poisson arrivals of long prompts, the
workload chunked prefill is for: inter-token latency p50/p99, TTFT of long and short prompts,
output tok/s, for the previous engine and this one over a sweep of token budgets (the largest
holds every prompt whole: no chunking). offline and concurrency: the standard workloads, which
chunking must not slow down.
"""
from __future__ import annotations

import sys

from common import long_mix
from common.bench_set import run_parts

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p11"
PREVIOUS = f"p{int(ENGINE[1:]) - 1:02d}"                    # "p10"
AA = [PREVIOUS, PREVIOUS + "#2"]


def budget(tokens: int, *options: str) -> str:
    return " ".join([ENGINE, f"max_num_batched_tokens={tokens}", *options])


def mix(name: str, preset: str, engines: list[str], *extra: str):
    """A part that runs long-mix (its own runner, not common.bench's workloads)."""
    def part(rest: list[str], command: str) -> None:
        long_mix.main(["--phase", PHASE, "--presets", preset, "--engines", ",".join(engines), *extra, *rest],
                      part=name, make_command=command)
    part.preset, part.engines = preset, engines                     # what the part compares, for tests
    return part


def standard(workload: str, preset: str, *extra: str) -> list[list[str]]:
    return [["--workload", workload, "--presets", preset, *extra, "--engines", ",".join([*AA, ENGINE])]]


# 16384 holds an 8k prompt and every decode in one step: no chunking ("unlimited"). K=2 lets a
# short prompt share a step with a long one (max_num_partial_prefills).
SWEEP_1B = [budget(b) for b in (512, 1024, 2048, 4096, 8192, 16384)] + [budget(2048, "max_num_partial_prefills=2")]
# Five 8B engines share one GPU (weights and a pool each): the 8B sweep is two parts, each with
# its own A/A control, read as two runs; the second has a file of its own (its p10 would replace the first's).
SWEEP_8B = [budget(b) for b in (512, 2048, 8192)]
SWEEP_8B_B = [budget(b) for b in (1024, 4096, 16384)]
GPU_PARTS = {
    "long-mix": mix("long-mix", "llama-1b", AA + SWEEP_1B),
    "long-mix-8b": mix("long-mix-8b", "llama-8b", AA + SWEEP_8B),
    "long-mix-8b-b": mix("long-mix-8b-b", "llama-8b", AA + SWEEP_8B_B, "--file", "long-mix-8b-b"),
    "offline": standard("offline", "llama-1b"),
    "concurrency": standard("concurrency", "llama-1b", "--concurrency", "1,64"),
    "concurrency-8b": standard("concurrency", "llama-8b", "--concurrency", "64"),
}
SMALL = ("--scale", "small")
CPU_PARTS = {   # budgets below the default max_num_seqs (256) need fewer seats; 512 holds every prompt
    "long-mix": mix("long-mix", "tiny-llama", AA + [budget(b, "max_num_seqs=32") for b in (32, 64, 128, 512)],
                    *SMALL),
    "offline": standard("offline", "tiny-llama", *SMALL),
    "concurrency": standard("concurrency", "tiny-llama", "--concurrency", "8,32", *SMALL),
}


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
