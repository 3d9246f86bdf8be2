"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each part is one comparison in one process, interleaved and repeated, the previous phase built
twice (the A/A control).

Tensor parallelism pays on several GPUs; on one, what a reader needs to know is that the new layer
costs nothing where it does nothing: TP = 1 through this phase's engine (its collectives are not
called, its sharded load reads whole tensors) against p15, at batch 1 and at 64 in flight, on
llama-1b and llama-8b ("latency", "latency-8b", "concurrency", "concurrency-8b", "offline"), and the
peer engine beside it ("nano-vllm", "nano-vllm-8b"). "scaling" (TP = 2 against TP = 1 on
llama-8b, batch 1 and 64 in flight) needs two GPUs of one host. "comm" computes what the
all-reduces move per token (no GPU: the model's shapes and the ring's formula).
"""
from __future__ import annotations

import csv
import sys

import torch

from common import peer
from common.bench_set import run_parts
from common.loader import resolve
from common.results import RESULTS

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p16"
PREVIOUS = f"p{int(ENGINE[1:]) - 1:02d}"                    # "p15"
ENGINES = ",".join([PREVIOUS, f"{PREVIOUS}#2", ENGINE])
SCALING = ",".join([ENGINE, f"{ENGINE}#2", f"{ENGINE} tensor_parallel_size=2"])


def standard(workload: str, preset: str, *extra: str, engines: str = ENGINES) -> list[list[str]]:
    return [["--workload", workload, "--presets", preset, *extra, "--engines", engines]]


def comm(argv: list[str], make_command: str) -> None:
    """Bytes a rank sends per token by TP degree, from the model's shapes: a ring all-reduce of
    `hidden` bf16 values sends 2 (N-1)/N x hidden of them (2 a layer, and the embedding's); the
    ring all-gather of a sampled row's logits sends (N-1)/N x vocab fp32 values."""
    rows = []
    for preset in ("llama-1b", "llama-8b"):
        cfg = resolve(preset).config
        for n in (2, 4, 8):
            ring = 2 * (n - 1) / n
            reduces = (2 * cfg.num_layers + 1) * ring * cfg.hidden_size * 2        # bf16
            gather = (n - 1) / n * cfg.vocab_size * 4                              # fp32 logits
            rows.append({"preset": preset, "tp": n, "all_reduces_per_token": 2 * cfg.num_layers + 1,
                         "all_reduce_bytes_per_token": int(reduces), "all_gather_bytes_per_token": int(gather),
                         "kv_heads_per_rank": max(1, cfg.num_kv_heads // n)})
    path = RESULTS / PHASE / "comm.csv"          # computed, not measured: not a run record
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        f.write(f"# {make_command}: computed from the presets' shapes\n")
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print("| preset | TP | all-reduces a token | all-reduce KiB a token | logits all-gather KiB a token | KV heads a rank |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['preset']} | {r['tp']} | {r['all_reduces_per_token']} | {r['all_reduce_bytes_per_token'] / 1024:.0f} "
              f"| {r['all_gather_bytes_per_token'] / 1024:.0f} | {r['kv_heads_per_rank']} |")
    print(f"[bench] wrote {path}")


def scaling(argv: list[str], make_command: str) -> None:
    if torch.cuda.device_count() < 2:
        raise SystemExit("the scaling part needs two GPUs of one host (TP = 2 against TP = 1)")
    from common import bench
    for run in standard("latency", "llama-8b", engines=SCALING) + \
            standard("concurrency", "llama-8b", "--concurrency", "64", engines=SCALING):
        bench.main(["--phase", PHASE, *run, *argv], part="scaling", make_command=make_command)


GPU_PARTS = {
    "latency": standard("latency", "llama-1b"),
    "latency-8b": standard("latency", "llama-8b"),
    "concurrency": standard("concurrency", "llama-1b", "--concurrency", "64"),
    "concurrency-8b": standard("concurrency", "llama-8b", "--concurrency", "64"),
    "offline": standard("offline", "llama-1b"),
    "nano-vllm": peer.part(PHASE, "1b"),
    "nano-vllm-8b": peer.part(PHASE, "8b"),
    "scaling": scaling,
    "comm": comm,
}
CPU_PARTS = {
    "comm": comm,
}


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
