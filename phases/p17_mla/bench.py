"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each part is one comparison in one process, interleaved and repeated, its baseline built twice
(the A/A control).

MLA's idea shows at decode over a long context: the naive decode rebuilds every head's K and V
from the cached latents each step, the absorbed one reads the latents once for all heads. So the
parts that show it run DeepSeek-V2-Lite's attention shape ("mla-lite", random weights, dense MLPs)
at batch 1 ("long", over prompts of 32k and 4k tokens) and 64 in flight ("long-64", over 4k: 64
sequences of 32k tokens are 65 GB of latents an engine, and the part builds three), absorbed
against naive; "kernel" times the latent kernel alone against the copy bandwidth; "kv-bytes"
computes what a token's cache entry costs (no GPU). "latency" checks that llama-1b (grouped-query
attention: nothing of this phase runs) did not regress against p16; "nano-vllm" runs the peer
engine on that workload in the same machine start.
"""
from __future__ import annotations

import csv
import sys

from common import peer
from common.bench_set import run_parts
from common.loader import resolve
from common.results import RESULTS

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p17"
PREVIOUS = f"p{int(ENGINE[1:]) - 1:02d}"                    # "p16"
NAIVE = "mla_decode=naive"
MLA_ENGINES = ",".join([f"{ENGINE} {NAIVE}", f"{ENGINE}#2 {NAIVE}", ENGINE])
CONTEXTS = (32768, 4096)                                    # the headline's first: a part cut short keeps it
POOL_BYTES = 40 << 30                                       # the pool "kv-bytes" sizes batches against


def kernel(argv: list[str], make_command: str) -> None:
    from .kernel_bench import main as kernel_main          # sets up Triton's interpreter on CPU
    kernel_main(argv, make_command)


def kernel_tune(argv: list[str], make_command: str) -> None:
    from .kernel_bench import main as kernel_main
    kernel_main([*argv, "--tune"], make_command)


def long_context(workload: str, contexts: tuple[int, ...], *extra: str) -> list[list[str]]:
    return [["--workload", workload, "--presets", "mla-lite", "--prompt-len", str(n), *extra,
             "--file", f"long-{workload}", "--engines", MLA_ENGINES] for n in contexts]


def kv_bytes(argv: list[str], make_command: str) -> None:
    """Bytes a token's cache entry costs (bf16, every layer), and how many 32k-token sequences a
    40 GiB pool holds: MLA's latent, the same attention with per-head K and V, llama-8b's GQA."""
    mla, llama = resolve("mla-lite").config, resolve("llama-8b").config
    per_head = mla.num_layers * mla.num_heads * (mla.head_dim + mla.v_head_dim) * 2
    rows = [("mla-lite: latent + rotary key", mla.num_layers * (mla.kv_lora_rank + mla.qk_rope_head_dim) * 2),
            ("mla-lite: K and V per head", per_head),
            ("llama-8b: K and V per KV head (GQA)", llama.num_layers * llama.num_kv_heads * llama.head_dim * 2 * 2)]
    path = RESULTS / PHASE / "kv-bytes.csv"                 # computed, not measured: not a run record
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        f.write(f"# {make_command}: computed from the presets' shapes, bf16, a pool of {POOL_BYTES >> 30} GiB\n")
        out = csv.writer(f)
        out.writerow(["cache", "bytes_per_token", "sequences_of_32k_in_pool"])
        for name, b in rows:
            out.writerow([name, b, POOL_BYTES // (b * 32768)])
    print("| cache | bytes a token | 32k-token sequences in 40 GiB |\n| --- | --- | --- |")
    for name, b in rows:
        print(f"| {name} | {b:,} | {POOL_BYTES // (b * 32768)} |")
    print(f"[bench] wrote {path}")


GPU_PARTS = {
    "long": long_context("latency", CONTEXTS),
    # 64 x (4k + the outputs) tokens of latents: 8.5 GB; a fixed 10 GiB pool each, three engines
    "long-64": long_context("concurrency", (4096,), "--concurrency", "64",
                            "--engine-options", f"kv_cache_bytes={10 << 30}"),
    "kernel": kernel,
    "kernel-tune": kernel_tune,
    "kv-bytes": kv_bytes,
    "latency": [["--workload", "latency", "--presets", "llama-1b",
                 "--engines", ",".join([PREVIOUS, f"{PREVIOUS}#2", ENGINE])]],
    "nano-vllm": peer.part(PHASE, "1b"),          # the peer engine beside "latency", same machine start
}
CPU_PARTS = {
    "kernel": kernel,
    "kv-bytes": kv_bytes,
}


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
