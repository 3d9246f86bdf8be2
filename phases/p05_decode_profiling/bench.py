"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each part is one comparison run by common.bench: the engines are measured in one process,
interleaved and repeated. On a GPU each part fits one 10-minute call; on a CPU the same
comparisons run at --scale small on tiny-llama (common.bench_set).

The profile is this phase's product (`make phase-NN profile`); the benchmark measures what came
of it: the previous engine on one device against this one (the lean step: fused RMSNorm, key mask
made once per step), and this one with lean_step=0, whose difference from the previous engine is
the price of the stage ranges while no profiler records (nothing, if they are right). The
"profile-pair" part profiles this engine's step without the fixes (lean_step=0) and with them in
one process, in rotated rounds (common.profile_pair), so the profile's two steps compare per round.
"""
from __future__ import annotations

import sys

from common.bench_set import aa, run_parts
from common.profile_pair import profile_part

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p05"
PREVIOUS = f"p{int(ENGINE[1:]) - 1:02d}"                    # "p04", on one device: no ranges at all
ENGINES = aa(f"{PREVIOUS},{ENGINE},{ENGINE} lean_step=0")     # the previous engine twice: the A/A control


def compare(*run: str, engines: str = ENGINES) -> list[list[str]]:
    return [[*run, "--engines", engines]]


GPU_PARTS = {
    "latency": compare("--workload", "latency", "--presets", "smollm2-135m-random,llama-1b",
                       engines=f"{ENGINES},hf-static"),
    "latency-8b": compare("--workload", "latency", "--presets", "llama-8b", engines=f"{ENGINES},hf-static"),
    "concurrency": compare("--workload", "concurrency", "--concurrency", "1,8,32,64", "--presets", "llama-1b",
                           engines=f"{ENGINES},hf-generate"),
    # llama-8b: five engines (with the A/A twin) at four levels took about 450 s without the twin;
    # 1 and 8 in flight, and 32 and 64, are two parts.
    "concurrency-8b": compare("--workload", "concurrency", "--concurrency", "1,8", "--presets", "llama-8b",
                              engines=f"{ENGINES},hf-generate"),
    "concurrency-8b-high": compare("--workload", "concurrency", "--concurrency", "32,64", "--presets", "llama-8b",
                                   engines=f"{ENGINES},hf-generate"),
    "offline": compare("--workload", "offline", "--presets", "llama-1b"),
    # llama-8b's full set takes four engines three rounds past one 10-minute call: its first 64
    # (three engines on 128 took about 435 s of samples alone).
    "offline-8b": compare("--workload", "offline", "--requests", "64", "--presets", "llama-8b"),
}
SMALL = ("--scale", "small", "--presets", "tiny-llama")
CPU_PARTS = {
    "latency": compare("--workload", "latency", *SMALL),
    "concurrency": compare("--workload", "concurrency", "--concurrency", "1,8", *SMALL),
    "offline": compare("--workload", "offline", *SMALL),
}


# --- the profile-pair part: the step without the fixes and with them, profiled in one process -----
GPU_PARTS["profile-pair"] = CPU_PARTS["profile-pair"] = profile_part(PHASE, [(ENGINE, {"lean_step": 0}),
                                                                         (ENGINE, {"lean_step": 1})])


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
