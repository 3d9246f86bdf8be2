"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each part is one comparison, the engines measured in one process, interleaved and repeated, the
previous phase built twice ("p11", "p11#2": the run's A/A control). On a GPU each part fits one
10-minute call; on a CPU the same comparison runs at small scale on tiny-llama.

shared-prefix (common/shared_prefix.py): 128 requests sharing a 4k-token system prompt, and the
no-sharing control (the same lengths, nothing shared): TTFT p50/p99, output tok/s, hit rate
against the ideal, for the previous engine, this one, and this one with the cache off.
multi-turn: 32 chats of 4 turns, each turn re-sending the conversation so far. chat (CPU): one
chat on SmolLM2 opening with a long paste, the last turn's TTFT. The cache is cleared before
every sample. offline and concurrency: the standard workloads, which the cache must not slow down.
"""
from __future__ import annotations

import sys

from common import shared_prefix
from common.bench_set import run_parts

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p12"
PREVIOUS = f"p{int(ENGINE[1:]) - 1:02d}"                    # "p11"
AA = [PREVIOUS, PREVIOUS + "#2"]
OFF = f"{ENGINE} enable_prefix_caching=0"                   # the ablation: this engine, no cache


def shared(name: str, preset: str, workloads: str, engines: list[str], *extra: str):
    """A part that runs common.shared_prefix's workloads (its own runner, not common.bench's)."""
    def part(rest: list[str], command: str) -> None:
        shared_prefix.main(["--phase", PHASE, "--presets", preset, "--workloads", workloads,
                            "--engines", ",".join(engines), *extra, *rest], part=name, make_command=command)
    part.preset, part.engines, part.workloads = preset, engines, workloads.split(",")   # for tests
    return part


def standard(workload: str, preset: str, *extra: str) -> list[list[str]]:
    return [["--workload", workload, "--presets", preset, *extra, "--engines", ",".join([*AA, ENGINE])]]


SMALL = ("--scale", "small")
GPU_PARTS = {
    "shared-prefix": shared("shared-prefix", "llama-1b", "shared-prefix,no-sharing", AA + [ENGINE, OFF]),
    "shared-prefix-8b": shared("shared-prefix-8b", "llama-8b", "shared-prefix", AA + [ENGINE]),
    "no-sharing-8b": shared("no-sharing-8b", "llama-8b", "no-sharing", AA + [ENGINE]),   # 8B: one part each
    "multi-turn": shared("multi-turn", "llama-1b", "multi-turn", AA + [ENGINE]),
    "offline": standard("offline", "llama-1b"),
    "concurrency": standard("concurrency", "llama-1b", "--concurrency", "1,64"),
}
CPU_PARTS = {
    "shared-prefix": shared("shared-prefix", "tiny-llama", "shared-prefix,no-sharing", AA + [ENGINE, OFF], *SMALL),
    "multi-turn": shared("multi-turn", "tiny-llama", "multi-turn", AA + [ENGINE], *SMALL),
    "chat": shared("chat", "smollm2-135m", "chat", AA + [ENGINE], *SMALL, "--repeats", "2"),   # real prefills
    "offline": standard("offline", "tiny-llama", *SMALL),
    "concurrency": standard("concurrency", "tiny-llama", "--concurrency", "8,32", *SMALL),
}


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
