"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each part is one comparison in one process, interleaved and repeated, the previous phase built
twice (the A/A control); on a CPU only the kernel's check runs (Triton's interpreter).

Split-K pays where one program per (sequence, KV head) leaves SMs idle: a long context at a small
batch. So the parts that show the idea are long-context decode at batch 1 ("long", "long-8b":
prompts of 4k, 16k and 32k tokens, then 256 new tokens), both engines on our Triton kernel (the
only difference is the split), and the kernel sweep (`kernel`: the kernel alone, replayed in CUDA
graphs, against the copy bandwidth). The standard parts (latency, 64 in flight, offline) check
that nothing regressed where the batch already fills the GPU (one split: the previous kernel);
"nano-vllm" and "nano-vllm-8b" run the peer engine on those workloads in the same machine start.
"""
from __future__ import annotations

import sys

from common import peer
from common.bench_set import run_parts

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p15"
PREVIOUS = f"p{int(ENGINE[1:]) - 1:02d}"                    # "p14"
TRITON = "attention_backend=triton"
AA = [f"{PREVIOUS} {TRITON}", f"{PREVIOUS}#2 {TRITON}"]
ENGINES = ",".join([*AA, f"{ENGINE} {TRITON}"])
CONTEXTS = (32768, 16384, 4096)          # the headline's first: a part cut short by its time limit keeps it
LONG_REPEATS = "3"                       # not five: three llama-8b engines over three contexts fit one call
POOL = f"kv_cache_bytes={9 << 29}"      # 4.5 GiB: a 32k llama-8b sequence is 4 GiB of K/V; three engines share one GPU


def kernel(argv: list[str], make_command: str) -> None:
    from .kernel_bench import main as kernel_main          # sets up Triton's interpreter on CPU
    kernel_main(argv, make_command)


def kernel_tune(argv: list[str], make_command: str) -> None:
    from .kernel_bench import main as kernel_main
    kernel_main([*argv, "--tune"], make_command)


def long_context(preset: str) -> list[list[str]]:
    """Batch 1 at each context: one request whose prompt is that long."""
    return [["--workload", "latency", "--presets", preset, "--prompt-len", str(n), "--repeats", LONG_REPEATS,
             "--engine-options", POOL, "--file", "long-context", "--engines", ENGINES] for n in CONTEXTS]


def standard(workload: str, preset: str, *extra: str) -> list[list[str]]:
    return [["--workload", workload, "--presets", preset, *extra, "--engines", ENGINES]]


GPU_PARTS = {
    "kernel": kernel,
    "kernel-tune": kernel_tune,
    "long": long_context("llama-1b"),
    "long-8b": long_context("llama-8b"),
    "latency": standard("latency", "llama-1b"),
    "latency-8b": standard("latency", "llama-8b"),
    "concurrency": standard("concurrency", "llama-1b", "--concurrency", "64"),
    "offline": standard("offline", "llama-1b"),
    "nano-vllm": peer.part(PHASE, "1b"),          # the peer engine on the same workloads, same machine start
    "nano-vllm-8b": peer.part(PHASE, "8b"),
}
CPU_PARTS = {
    "kernel": kernel,
}


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
