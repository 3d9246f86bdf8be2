"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each speed part is one comparison in one process, interleaved and repeated: the float engine (bf16)
built twice (the A/A control), W8A8 and FP8 beside it (FP8 only on SM 8.9+; elsewhere the part
says so and runs without it). What quantization must show is measured, not assumed:
  "gemm"         the kernels alone (kernel_bench.py): bf16 against int8 (our Triton kernel, and
                 torch._int_mm with and without its epilogue) and fp8 (torch._scaled_mm) at
                 llama-1b's and llama-8b's Linear shapes, M = 1 ... 4096, and the per-token
                 quantizers alone; TFLOP/s and weight GB/s; at M = 1, 4, 16 the decode
                 candidates (tiles, split-K, GEMV) and the fastest per shape. On a CPU: the
                 kernels' check only
  "accuracy"     the real SmolLM2 on a public-domain text it was not calibrated on (Chapter I of
                 Alice in Wonderland; calibration: Chapter II's opening): perplexity, and top-1
                 agreement with the float model, teacher-forced (every position sees the true
                 text), for float, W8A8 without smoothing, W8A8, FP8. CPU (fp32) and GPU (bf16)
  "latency"      batch 1 on llama-1b, then llama-8b (decode is weight-bound: the headline)
  "concurrency", "concurrency-8b"    64 requests in flight (llama-8b: without fp8, see POOL_8B)
  "offline", "offline-8b"            the offline batch (256 requests; llama-8b: without fp8)
  "profile-pair" the decode step of each mode profiled (llama-1b, batch 1 and 64): where INT8's
                 time goes, kernel by kernel (the quantizers, the GEMMs, their epilogues)
  "profile-pair-8b"  the same on llama-8b at batch 1 (one engine at a time: fp8 fits): the step's
                 GPU busy time against its wall time (is w8a8's step host-bound?)
On a CPU the speed parts run tiny-llama at small scale: their plumbing, not a speed.
"""
from __future__ import annotations

import math
import sys
import uuid

import torch

from common import bench
from common.bench_set import run_parts
from common.profile_pair import profile_part
from common.device import default_device, device_name
from common.results import RESULTS, device_tag, fill_readme_blocks, provenance, read_list, write_records
from common.texts import evaluation_text

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p19"
MODES = (None, "w8a8-nosmooth", "w8a8", "fp8")
WINDOW = 512                                                # teacher-forced tokens a forward


def engines(device: str, extra: str = "", fp8: bool = True) -> str:
    """bf16 twice (A/A), w8a8, and fp8 where the device runs it (and the part has room for it)."""
    specs = [ENGINE, f"{ENGINE}#2", f"{ENGINE} quantization=w8a8"]
    if fp8 and fp8_supported(device):
        specs.append(f"{ENGINE} quantization=fp8")
    elif fp8:
        print(f"[bench] {device_name(device)}: no fp8 (e4m3 GEMMs need SM 8.9+); the part runs without it",
              flush=True)
    return ",".join(f"{s} {extra}".strip() for s in specs)


def fp8_supported(device: str) -> bool:
    if not hasattr(torch, "float8_e4m3fn"):
        return False
    return not device.startswith("cuda") or torch.cuda.get_device_capability(device) >= (8, 9)


def speed(name: str, workload: str, preset: str, *extra: str, options: str = "", fp8: bool = True):
    """A part of common.bench's: its engine list decided on the device it runs on."""
    def part(rest: list[str], command: str) -> None:
        device = rest[rest.index("--device") + 1] if "--device" in rest else default_device()
        bench.main(["--phase", PHASE, "--workload", workload, "--presets", preset, *extra,
                    "--engines", engines(device, options, fp8), *rest], part=name, make_command=command)
    part.preset, part.workload = preset, workload
    return part


# --- accuracy ------------------------------------------------------------------------------------
def accuracy(rest: list[str], command: str) -> None:
    """SmolLM2, every mode: perplexity and top-1 agreement with the float model, teacher-forced."""
    from . import LLM
    device = rest[rest.index("--device") + 1] if "--device" in rest else default_device()
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    run = {"run_id": uuid.uuid4().hex[:12], "part": "accuracy", "make_command": command}
    reference, records = None, []
    for mode in MODES:
        if mode == "fp8" and not fp8_supported(device):
            print(f"[bench] {device_name(device)}: no fp8 (needs SM 8.9+): skipped", flush=True)
            continue
        llm = LLM("smollm2-135m", device=device, dtype=dtype, quantization=mode, detokenize=False,
                  kv_cache_bytes=64 << 20, cuda_graph=False)            # its runner is not used here
        tokens = llm.tokenizer.encode(evaluation_text())
        logits = teacher_forced_logits(llm, tokens)               # (n - 1, vocab) fp32, on the host
        reference = logits if reference is None else reference
        records.append(accuracy_record(mode, tokens, logits, reference, weight_bytes(llm.model), device, dtype, run))
        del llm
    out = RESULTS / PHASE / f"accuracy-{device_tag(device_name(device))}.json"
    write_records(out, records)
    print(accuracy_table("gpu" if device.startswith("cuda") else "cpu"))
    fill_readme_blocks(PHASE, "accuracy", {tag: accuracy_table(tag) for tag in ("cpu", "gpu")})
    print(f"[bench] run {run['run_id']}: wrote {len(records)} records to {out}")


def accuracy_table(tag: str) -> str:
    """The README's accuracy table, generated: "cpu" from accuracy-cpu.json, "gpu" from the first
    GPU's file (accuracy-h100.json, ...)."""
    files = sorted(f for f in (RESULTS / PHASE).glob("accuracy-*.json") if (f.stem == "accuracy-cpu") == (tag == "cpu"))
    records = read_list(files[0]) if files else []
    if not records:
        return f"_accuracy on a {tag.upper()}: not yet measured (`make phase-19 bench PART=accuracy` there)._"
    r0 = records[0]
    tag = files[0].stem.removeprefix("accuracy-")
    lines = [f"_{r0['device']}, {r0['dtype']}, {r0['setting']['tokens']} tokens of Chapter I, teacher-forced "
             f"(generated from accuracy-{tag}.json)_", "",
             "| mode | perplexity | top-1 agreement with float | logits error (rel.) | layers' Linears |",
             "| --- | --- | --- | --- | --- |"]
    for r in records:
        m = r["metrics"]
        lines.append(f"| {r['setting']['quantization']} | {m['perplexity']:.2f} | {100 * m['top1_agreement']:.1f}% "
                     f"| {m['logits_rel_err']:.3f} | {m['linear_weight_bytes'] / 2**20:.0f} MiB |")
    return "\n".join(lines)


@torch.inference_mode()
def teacher_forced_logits(llm, tokens: list[int]) -> torch.Tensor:
    """Logits of every position but the last over `tokens`, in windows of WINDOW tokens (each from
    position 0, in a private pool): (len(tokens) - 1, vocab) fp32 on the host. The first token of
    each window is predicted by the window before it, so its row is taken from there."""
    from .kv_cache import KVCache
    from .model_runner import ModelRunner
    from .smoothing import BLOCK, prefill_plan
    cache = KVCache(llm.model.cfg, -(-WINDOW // BLOCK), BLOCK, llm.device, llm.dtype)
    runner = ModelRunner(llm.model, cache, llm.device, llm.runner.backend)
    rows = []
    for start in range(0, len(tokens) - 1, WINDOW):
        window = tokens[start:start + WINDOW]
        rows.append(runner.run(prefill_plan(window), scored=[len(window)]).float().cpu())
    return torch.cat(rows)[:len(tokens) - 1]


def accuracy_record(mode, tokens, logits, reference, linear_bytes, device, dtype, run) -> dict:
    targets = torch.tensor(tokens[1:])
    nll = torch.nn.functional.cross_entropy(logits, targets).item()
    metrics = {"perplexity": math.exp(nll), "nll": nll,
               "top1_agreement": (logits.argmax(-1) == reference.argmax(-1)).float().mean().item(),
               "top1_accuracy": (logits.argmax(-1) == targets).float().mean().item(),
               "logits_rel_err": ((logits - reference).norm() / reference.norm()).item(),
               "linear_weight_bytes": linear_bytes}
    return {"phase": PHASE, "engine": ENGINE if mode is None else f"{ENGINE} quantization={mode}",
            "workload": "accuracy", "preset": "smollm2-135m", "dtype": dtype, "scale": "full",
            "setting": {"quantization": mode or "none", "text": "alice_chapter1", "tokens": len(tokens),
                        "window": WINDOW},
            "device": device_name(device), "run_id": run["run_id"], "part": run["part"], "repeats": 1,
            "metrics": metrics, "provenance": provenance(device_name(device)) | {"make_command": run["make_command"]}}


def weight_bytes(model) -> int:
    """Bytes of the layers' Linear weights and scales (the part quantization changes)."""
    return sum(t.numel() * t.element_size() for layer in model.layers for block in (layer.attn, layer.mlp)
               for name, t in [*block.named_parameters(), *block.named_buffers()] if "weight" in name)


def profile(name: str, shape: tuple[str, list[int]] | None = None):
    """Decode steps of bf16, w8a8 and fp8 profiled in rotated rounds (common.profile_pair), one engine
    built at a time: where a step's time goes, stage by stage and kernel by kernel, and how much of
    it the GPU is busy. By default llama-1b at batch 1 and 64 (on a CPU: tiny-llama); shape (preset,
    batch sizes) instead."""
    def part(rest: list[str], command: str) -> None:
        device = rest[rest.index("--device") + 1] if "--device" in rest else default_device()
        modes = ["w8a8", *(["fp8"] if fp8_supported(device) else [])]
        engines = [(ENGINE, {}), *[(ENGINE, {"quantization": m}) for m in modes]]
        profile_part(PHASE, engines, name, shape)(rest, command)
    return part


def gemm(rest: list[str], command: str) -> None:
    from .kernel_bench import main as kernel_main          # sets up Triton's interpreter on CPU
    kernel_main(rest, command)


# llama-8b with many tokens in flight: bf16 twice (2 x 15 GiB) and w8a8 (8 GiB, built from 15 GiB of
# bf16 weights) with their pools fill most of an 80 GB GPU; a fourth engine would not fit while the
# third loads. fp8's llama-8b numbers: latency (and its GEMMs: gemm).
POOL_8B = f"kv_cache_bytes={6 << 30}"

GPU_PARTS = {
    "gemm": gemm,
    "accuracy": accuracy,
    "latency": speed("latency", "latency", "llama-1b,llama-8b"),
    "concurrency": speed("concurrency", "concurrency", "llama-1b", "--concurrency", "64"),
    "concurrency-8b": speed("concurrency-8b", "concurrency", "llama-8b", "--concurrency", "64", fp8=False),
    "offline": speed("offline", "offline", "llama-1b"),
    "offline-8b": speed("offline-8b", "offline", "llama-8b", options=POOL_8B, fp8=False),
    "profile-pair": profile("profile-pair"),
    "profile-pair-8b": profile("profile-pair-8b", ("llama-8b", [1])),
}
CPU_PARTS = {
    "gemm": gemm,
    "accuracy": accuracy,
    "latency": speed("latency", "latency", "tiny-llama", "--scale", "small"),
    "concurrency": speed("concurrency", "concurrency", "tiny-llama", "--concurrency", "8", "--scale", "small"),
    "offline": speed("offline", "offline", "tiny-llama", "--scale", "small"),
    "profile-pair": profile("profile-pair"),
}


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
