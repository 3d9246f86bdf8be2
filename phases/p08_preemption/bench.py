"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each part is one comparison run by common.bench: the engines are measured in one process,
interleaved and repeated. On a GPU each part fits one 10-minute call; on a CPU the same
comparison runs at --scale small on tiny-llama.

A KV pool deliberately too small for the offline set: the previous engine, which reserves every
admitted request's worst case, against this one, which allocates as sequences grow and preempts
by recompute or by swap when the pool runs out. The previous engine is the baseline, built twice
(the A/A control); every record carries the preemptions of its samples (num_preemptions) and the
requests decoding at a time on average (mean_in_flight).
"""
from __future__ import annotations

import sys

from common.bench_set import aa, run_parts

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p08"
PREVIOUS = f"p{int(ENGINE[1:]) - 1:02d}"                    # "p07"


def small_pool(kv_bytes: int) -> str:
    pool = f"kv_cache_bytes={kv_bytes}"
    return aa(f"{PREVIOUS} {pool},{ENGINE} {pool} preemption=recompute,{ENGINE} {pool} preemption=swap")


GPU_PARTS = {   # llama-1b: 32 KiB of K/V per token in bf16, so 2 GiB holds 64k tokens (~60 worst cases)
    "offline-small-kv": [["--workload", "offline", "--presets", "llama-1b", "--engines", small_pool(2 << 30)]],
}
CPU_PARTS = {   # tiny-llama: 512 B per token in fp32, so 2 MiB holds 4096 tokens (~3 worst cases)
    "offline-small-kv": [["--workload", "offline", "--scale", "small", "--presets", "tiny-llama",
                          "--engines", small_pool(2 << 20)]],
}


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
