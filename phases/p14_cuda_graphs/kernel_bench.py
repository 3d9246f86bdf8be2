"""`make phase-NN kernel`: check the Triton paged decode kernel, then time it.

1. Check: against a float64 reference on random inputs of awkward sizes (contexts that end
   mid-page, page sizes 1, 5 and 16, GQA groups of 1, 3, 4 and 8, head dims 16 to 128), on
   scattered page tables, with the output poisoned (NaN) before each call: every element must be
   written and within tolerance (fp32 in the interpreter: 1e-4; bf16 on a GPU: 2e-2).
2. Time (GPU only): contexts 128 to 32k x batch 1 to 256 on the llama-1b attention shape
   (32 query heads, 8 KV heads, head dim 64), pages of 16: our kernel, FlashAttention 4 paged
   (when installed) and the torch reference (gather + SDPA) on the same inputs, as GB/s of K/V
   read against the copy bandwidth measured in the same run; and FlashAttention 4 at pages of 128
   too, its fast path (pages of 16 take its slower one). Each call is timed inside a CUDA graph,
   replayed (triton.testing.do_bench_cudagraph): a small shape's kernel takes microseconds, less
   than launching it from Python, and a launch-bound timing would measure the host, not the kernel.
   A call that cannot be captured is timed by launches, and its record says so ("timer").
3. p14's fused elementwise kernels (rope + K/V store, add + RMSNorm, SiLU * up), checked against
   the torch ops they replace and timed beside them (section 3 below).
Writes results/<phase>/kernel-<device>.json. On CPU the kernels run in Triton's interpreter.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")       # before triton is first imported

from common import roofline                               # noqa: E402
from common.device import device_name                     # noqa: E402
from common.results import RESULTS, device_tag, provenance, write_records   # noqa: E402

from .fused_elementwise import add_rms_norm, silu_and_mul   # noqa: E402
from .layers import apply_rotary                           # noqa: E402
from .rope_store import rope_and_store                     # noqa: E402
from .triton_decode import paged_decode                   # noqa: E402

PHASE = __package__.split(".")[-1]
# (batch, query heads, kv heads, head dim, page size, context lengths): awkward on purpose
CHECKS = [(3, 4, 2, 16, 4, [15, 1, 9]), (2, 9, 3, 64, 5, [33, 70]), (2, 8, 8, 32, 1, [11, 64]),
          (4, 32, 8, 64, 16, [1, 17, 100, 255]), (2, 32, 8, 128, 16, [129, 40])]
CONTEXTS, BATCHES = (128, 512, 1024, 4096, 16384, 32768), (1, 8, 64, 256)
H, KV, D, PAGE = 32, 8, 64, 16
LARGE_PAGE = 128                    # FlashAttention 4's fast path: timed beside PAGE for it alone
TORCH_MAX_BYTES = 8 << 30           # the reference copies K/V twice over: skip it on larger inputs


def random_case(B, heads, kv, d, page, lens, device, dtype):
    """q, pages and scattered page tables; slots nobody owns hold large values (must not leak in)."""
    pages_needed = sum(-(-n // page) for n in lens)
    num_pages = pages_needed + 7
    k_pages = torch.randn(num_pages, page, kv, d, device=device).to(dtype)
    v_pages = torch.randn(num_pages, page, kv, d, device=device).to(dtype)
    order = torch.randperm(num_pages).tolist()
    tables, at = [], 0
    for n in lens:
        tables.append(order[at:at + -(-n // page)])
        at += len(tables[-1])
    width = max(len(t) for t in tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device)
    q = torch.randn(B, heads, d, device=device).to(dtype)
    return q, k_pages, v_pages, tables, table, torch.tensor(lens, dtype=torch.int32, device=device)


def reference(q, k_pages, v_pages, tables, lens) -> torch.Tensor:
    """Each sequence's one query over exactly its keys, read page by page, in float64."""
    G, out = q.shape[1] // k_pages.shape[2], []
    for b, (table, n) in enumerate(zip(tables, lens)):
        k = k_pages[table].flatten(0, 1)[:n].double().repeat_interleave(G, dim=1)
        v = v_pages[table].flatten(0, 1)[:n].double().repeat_interleave(G, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].double(), k) / math.sqrt(q.shape[-1])
        out.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), v))
    return torch.stack(out)


def check(device: str, dtype: torch.dtype) -> list[dict]:
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    results = []
    for B, heads, kv, d, page, lens in CHECKS:
        q, k_pages, v_pages, tables, table, lens_t = random_case(B, heads, kv, d, page, lens, device, dtype)
        out = paged_decode(q, k_pages, v_pages, table, lens_t, out=torch.full_like(q, float("nan")))
        err = (out.double() - reference(q, k_pages, v_pages, tables, lens).to(out.device)).abs().max().item()
        ok = bool(torch.isfinite(out).all()) and err <= tolerance
        results.append({"setting": {"batch": B, "heads": heads, "kv_heads": kv, "head_dim": d, "page": page,
                                    "context_lens": lens}, "metrics": {"max_abs_err": err, "tolerance": tolerance},
                        "ok": ok})
        print(f"[kernel] check B={B} H={heads} KV={kv} D={d} page={page} lens={lens}: "
              f"max |err| {err:.2e} ({'ok' if ok else 'FAILED'}, tolerance {tolerance:g})", flush=True)
    return results


def timed_us(fn) -> tuple[float, str]:
    """(median microseconds per call, the timer): CUDA-graph replay of many calls where fn can be
    captured, else launches from Python (triton.testing.do_bench)."""
    import triton.testing
    try:
        return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median"), "cudagraph"
    except RuntimeError as e:       # not capturable (a host sync inside, say): time the launches
        print(f"[kernel] no CUDA graph ({str(e).splitlines()[0][:80]}): timing launches", flush=True)
        torch.cuda.synchronize()
        return 1e3 * triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"), "launch"


def implementations(case) -> dict:
    """Name -> a call on the same inputs: ours, FlashAttention 4 (if installed), the reference."""
    q, k_pages, v_pages, _, table, lens = case
    impls = {"triton": lambda: paged_decode(q, k_pages, v_pages, table, lens)}
    try:
        from flash_attn.cute import flash_attn_varlen_func
        impls["flash-attn"] = lambda: flash_attn_varlen_func(q.unsqueeze(1), k_pages, v_pages, seqused_k=lens,
                                                             page_table=table)
    except ImportError:
        pass
    if 2 * k_pages.numel() * k_pages.element_size() <= TORCH_MAX_BYTES:
        impls["torch"] = lambda: torch_reference(q, k_pages, v_pages, table, lens)
    return impls


def torch_reference(q, k_pages, v_pages, table, lens):
    """The torch backend's decode: gather through the table, pad, mask, SDPA."""
    S = k_pages.shape[1] * table.shape[1]
    k, v = (p[table.long()].flatten(1, 2) for p in (k_pages, v_pages))
    mask = (torch.arange(S, device=q.device)[None, :] < lens[:, None])[:, None, None, :]
    B, KV, D = q.shape[0], k.shape[2], q.shape[2]
    return torch.nn.functional.scaled_dot_product_attention(
        q.view(B, KV, -1, D), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)


def time_grid(device: str, copy_bytes_per_s: float) -> list[dict]:
    """Every (context, batch) at pages of PAGE (every implementation) and LARGE_PAGE (FlashAttention 4)."""
    results = []
    for context in CONTEXTS:
        for B in BATCHES:
            for page, only in ((PAGE, None), (LARGE_PAGE, "flash-attn")):
                results += time_case(device, B, context, page, only, copy_bytes_per_s)
    return results


def time_case(device: str, B: int, context: int, page: int, only: str | None, copy_bytes_per_s: float) -> list[dict]:
    """One input (B sequences of `context` tokens in pages of `page`), each implementation (or `only`)."""
    case = random_case(B, H, KV, D, page, [context] * B, device, torch.bfloat16)
    kv_bytes = 2 * B * context * KV * D * 2                      # K and V, bf16, read once
    results = []
    for name, fn in implementations(case).items():
        if only and name != only:
            continue
        us, timer = timed_us(fn)
        gb_s = kv_bytes / (us * 1e-6) / 1e9
        results.append({"engine": name, "setting": {"batch": B, "context": context, "page": page,
                                                    "heads": H, "kv_heads": KV, "head_dim": D},
                        "metrics": {"us": us, "kv_gb_s": gb_s, "copy_frac": gb_s * 1e9 / copy_bytes_per_s},
                        "timer": timer})
        print(f"[kernel] {name:<10} B={B:<4} context={context:<6} page={page:<4} {us:9.1f} us  {gb_s:7.0f} GB/s "
              f"of K/V ({100 * results[-1]['metrics']['copy_frac']:.0f}% of copy, {timer})", flush=True)
    del case
    torch.cuda.empty_cache()
    return results


# --- 3. p14's fused elementwise kernels against the torch ops they replace ---------------------
# rope_store (rotary on q and k, K and V into the pool: 8 kernels -> 1), add_rms_norm (the residual
# add, then RMSNorm: 2 -> 1), silu_and_mul (2 -> 1). The torch side is the code the CPU path and
# fused_kernels=False run (layers.py, KVCache.store). Checked like the decode kernel (fp32: 1e-5;
# bf16: 2e-2, one rounding step), outputs and in-place writes alike; timed (GPU) at the llama-1b and
# llama-8b shapes, T = 1, 64, 256 tokens, replayed from graphs: at T = 1 a few kilobytes move and the
# time is a kernel's floor, which is what fusing saves; the bytes over the time against the copy
# bandwidth say how far above that floor the larger T run.
@dataclass(frozen=True)
class Shape:
    preset: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int


FUSED_SHAPES = (Shape("llama-1b", 2048, 8192, 32, 8, 64), Shape("llama-8b", 4096, 14336, 32, 8, 128))
FUSED_CHECK_SHAPE = Shape("tiny", 96, 160, 6, 2, 16)        # awkward widths: masks in every kernel
FUSED_TOKENS = (1, 64, 256)
SLOTS = 4096                                           # the pool the K/V rows land in


def fused_cases(shape: Shape, T: int, device: str, dtype: torch.dtype) -> dict:
    """Name -> (fused call, torch call, bytes the fused kernel reads and writes, the pairs of tensors
    the two write in place). Each call gets its own copy of what it writes, so the two sides can be
    compared after."""
    g = torch.Generator(device="cpu").manual_seed(T)
    rand = lambda *size: torch.randn(*size, generator=g).to(device, dtype)     # noqa: E731
    item = torch.tensor([], dtype=dtype).element_size()
    H, KV, D = shape.heads, shape.kv_heads, shape.head_dim
    qkv, x, res = rand(T, H + 2 * KV, D), rand(T, shape.hidden), rand(T, shape.hidden)
    weight, gate_up = rand(shape.hidden), rand(T, 2 * shape.intermediate)
    positions = torch.randperm(SLOTS, generator=g)[:T].to(device)
    slots = torch.randperm(SLOTS, generator=g)[:T].to(device)
    angles = torch.arange(SLOTS, dtype=torch.float32)[:, None] * torch.rand(D // 2, generator=g)[None, :]
    cos, sin = (f(torch.cat([angles, angles], -1)).to(device) for f in (torch.cos, torch.sin))
    pools = [torch.zeros(2, SLOTS, KV, D, device=device, dtype=dtype) for _ in range(2)]
    qkvs, residuals = [qkv.clone(), qkv.clone()], [res.clone(), res.clone()]
    return {
        "rope_store": (lambda: rope_and_store(qkvs[0], positions, slots, cos, sin, pools[0][0], pools[0][1], H),
                       lambda: rope_torch(qkvs[1], positions, slots, cos, sin, pools[1], H),
                       (2 * T * (H + 2 * KV) * D) * item, (qkvs, pools)),
        "add_rms_norm": (lambda: add_rms_norm(x, residuals[0], weight, 1e-5),
                         lambda: add_rms_norm_torch(x, residuals[1], weight, 1e-5),
                         (4 * T + 1) * shape.hidden * item, (residuals,)),
        "silu_and_mul": (lambda: silu_and_mul(gate_up),
                         lambda: F.silu(gate_up[:, :shape.intermediate]) * gate_up[:, shape.intermediate:],
                         3 * T * shape.intermediate * item, ()),
    }


def rope_torch(qkv, positions, slots, cos, sin, pool, H: int) -> torch.Tensor:
    """The unfused path: rotate q and k (layers.apply_rotary), write k and v (KVCache.store)."""
    KV = (qkv.shape[1] - H) // 2
    c, s = cos[positions][:, None, :], sin[positions][:, None, :]
    q, k, v = qkv.split([H, KV, KV], dim=1)
    q.copy_(apply_rotary(q, c, s))
    pool[0].index_copy_(0, slots, apply_rotary(k, c, s))
    pool[1].index_copy_(0, slots, v)
    return q


def add_rms_norm_torch(x, residual, weight, eps: float) -> torch.Tensor:
    """The unfused path of layers.RMSNorm: the add (written back to the stream), then the norm."""
    residual.add_(x)
    return F.rms_norm(residual, (residual.shape[-1],), weight, eps)


def check_fused(device: str, dtype: torch.dtype) -> list[dict]:
    """Each fused kernel against its torch ops on awkward and real widths: outputs and whatever
    it writes in place (the stream, the rotated q, the pool's slots)."""
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    shapes = (FUSED_CHECK_SHAPE,) + (FUSED_SHAPES if device == "cuda" else ())
    results = []
    for shape in shapes:
        for T in (1, 7):
            for name, (fused, ref, _, written) in fused_cases(shape, T, device, dtype).items():
                outs = [fused(), ref()]
                pairs = [(outs[0], outs[1])] + [(a, b) for a, b in written]
                err = max((a.float() - b.float()).abs().max().item() for a, b in pairs)
                results.append({"kernel": name, "setting": {"preset": shape.preset, "tokens": T},
                                "max_abs_err": err, "ok": err <= tol})
                print(f"[fusion] check {name:<13} {shape.preset:<9} T={T}: max |err| {err:.2e} "
                      f"{'ok' if err <= tol else 'FAIL'}", flush=True)
    return results


def time_fused(device: str, copy_bytes_per_s: float) -> list[dict]:
    """Every kernel, shape and T: fused against torch, microseconds and the fused side's GB/s."""
    results = []
    for shape in FUSED_SHAPES:
        for T in FUSED_TOKENS:
            for name, (fused, ref, nbytes, _) in fused_cases(shape, T, device, torch.bfloat16).items():
                us = {"fused": timed_us(fused)[0], "torch": timed_us(ref)[0]}
                gb_s = nbytes / (us["fused"] * 1e-6) / 1e9
                results.append({"engine": name, "setting": {"preset": shape.preset, "tokens": T},
                                "metrics": {"fused_us": us["fused"], "torch_us": us["torch"],
                                            "saves_us": us["torch"] - us["fused"], "bytes": nbytes,
                                            "gb_s": gb_s, "copy_frac": gb_s * 1e9 / copy_bytes_per_s}})
                print(f"[fusion] {name:<13} {shape.preset:<9} T={T:<4} fused {us['fused']:7.1f} us  "
                      f"torch {us['torch']:7.1f} us  {gb_s:6.0f} GB/s ({100 * gb_s * 1e9 / copy_bytes_per_s:.0f}% "
                      f"of copy)", flush=True)
    return results


def main(argv: list[str] | None = None, make_command: str | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check-only", action="store_true", help="skip the timings")
    args, _ = p.parse_known_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    checks, fusion_checks = check(device, dtype), check_fused(device, dtype)
    if not all(c["ok"] for c in checks + fusion_checks):
        raise SystemExit("[kernel] a kernel disagrees with its reference: no timings taken")
    name = device_name(device)
    prov = provenance(name) | {"make_command": make_command or f"make phase-{PHASE[1:3]} kernel"}
    base = {"phase": PHASE, "preset": "llama-1b", "dtype": str(dtype).removeprefix("torch."), "scale": "full",
            "device": name, "provenance": prov}
    records = [base | {"engine": "triton", "workload": "kernel-check", **c} for c in checks]
    records += [base | {"engine": c.pop("kernel"), "workload": "fusion-check", **c} for c in fusion_checks]
    if device == "cuda" and not args.check_only:
        hw = roofline.measure(device)
        records += [base | {"workload": "kernel", "hardware": hw, **r} for r in time_grid(device, hw["copy_bytes_per_s"])]
        records += [base | {"workload": "fusion", "hardware": hw, **r}
                    for r in time_fused(device, hw["copy_bytes_per_s"])]
    # sweep: the script's records are one run; a re-run moves the last sweep to history/ whole
    write_records(RESULTS / PHASE / f"kernel-{device_tag(name)}.json", records, sweep=True)


if __name__ == "__main__":
    main(sys.argv[1:])
