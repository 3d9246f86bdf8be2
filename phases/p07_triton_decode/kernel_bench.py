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
Writes results/<phase>/kernel-<device>.json. On CPU the kernel runs in Triton's interpreter.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")       # before triton is first imported

from common import roofline                               # noqa: E402
from common.device import device_name                     # noqa: E402
from common.results import RESULTS, device_tag, provenance, write_records   # noqa: E402

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


def main(argv: list[str] | None = None, make_command: str | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check-only", action="store_true", help="skip the timings")
    args, _ = p.parse_known_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    checks = check(device, dtype)
    if not all(c["ok"] for c in checks):
        raise SystemExit("[kernel] the kernel disagrees with the reference: no timings taken")
    name = device_name(device)
    prov = provenance(name) | {"make_command": make_command or f"make phase-{PHASE[1:3]} kernel"}
    base = {"phase": PHASE, "preset": "llama-1b", "dtype": str(dtype).removeprefix("torch."), "scale": "full",
            "device": name, "provenance": prov}
    records = [base | {"engine": "triton", "workload": "kernel-check", **c} for c in checks]
    if device == "cuda" and not args.check_only:
        hw = roofline.measure(device)
        records += [base | {"workload": "kernel", "hardware": hw, **r} for r in time_grid(device, hw["copy_bytes_per_s"])]
    # sweep: the script's records are one run; a re-run moves the last sweep to history/ whole
    write_records(RESULTS / PHASE / f"kernel-{device_tag(name)}.json", records, sweep=True)


if __name__ == "__main__":
    main(sys.argv[1:])
