"""`make phase-NN kernel`: check the split-K paged decode kernel, then time it.

1. Check: against a float64 reference on random inputs of awkward sizes (contexts that end
   mid-page, page sizes 1, 5 and 16, GQA groups of 1, 3, 4 and 8, head dims 16 to 128), on
   scattered page tables, with the output poisoned (NaN) before each call: every element must be
   written and within tolerance (fp32 in the interpreter: 1e-4; bf16 on a GPU: 2e-2), at 1, 2, 3
   and 8 splits (more splits than tiles included), the splits merged by the combine kernel and, at
   8, by the split kernel's last program (fused: its done-counts must be back at 0 after).
2. Time (GPU only): contexts 1k to 128k x batch 1 to 64 on the llama-1b and llama-8b attention
   shapes (32 query heads, 8 KV heads, head dim 64 and 128), pages of 16 and 128: the kernel with
   the split count it chooses ("triton"), with one split ("triton 1 split": the previous phase's
   algorithm, one program per sequence and KV head, at this kernel's one-split launch shape), the
   chosen split count with the combine launched as the split kernel's programmatic dependent
   ("triton PDL": where it splits; the engine's default is not to), FlashAttention 4 paged (when installed) and the
   torch reference (gather + SDPA, small inputs) on the same inputs, as GB/s of K/V read against
   the copy bandwidth measured in the same run. Inputs over MAX_KV_BYTES of K/V are skipped. Each call is timed inside a CUDA graph,
   replayed (triton.testing.do_bench_cudagraph): a small shape's kernel takes microseconds, less
   than launching it from Python, and a launch-bound timing would measure the host, not the kernel.
   A call that cannot be captured is timed by launches, and its record says so ("timer").
3. Tune (--tune, GPU only; the bench's "kernel-tune" part): every launch shape (TUNE_LAUNCH) at
   the split counts of 1-8 programs an SM on TUNE_SHAPES, the combine separate and fused, written to kernel-tune-<device>.json:
   the data launch_config and target_waves are read from.
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

from .triton_decode import alloc_counters, choose_num_splits, paged_decode   # noqa: E402

PHASE = __package__.split(".")[-1]
# (batch, query heads, kv heads, head dim, page size, context lengths): awkward on purpose
CHECKS = [(3, 4, 2, 16, 4, [15, 1, 9]), (2, 9, 3, 64, 5, [33, 70]), (2, 8, 8, 32, 1, [11, 64]),
          (4, 32, 8, 64, 16, [1, 17, 100, 255]), (2, 32, 8, 128, 16, [129, 40])]
CHECK_SPLITS = (1, 2, 3, 8)
CHECK_FUSED = (8,)                  # split counts checked with the fused combine too (empty splits included)
CONTEXTS, BATCHES = (1024, 4096, 16384, 32768, 131072), (1, 4, 16, 64)
H, KV, PAGES = 32, 8, (16, 128)
HEAD_DIMS = {"llama-8b": 128, "llama-1b": 64}
MAX_KV_BYTES = 16 << 30             # K and V of one input: larger ones are skipped
TORCH_MAX_BYTES = 4 << 30           # the reference copies K/V twice over: skip it on larger inputs


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
    for (B, heads, kv, d, page, lens), splits, fused in ((c, s, f) for c in CHECKS for s in CHECK_SPLITS
                                                         for f in (False, True) if s in CHECK_FUSED or not f):
        q, k_pages, v_pages, tables, table, lens_t = random_case(B, heads, kv, d, page, lens, device, dtype)
        counters = alloc_counters(B, kv, device) if fused else None
        out = paged_decode(q, k_pages, v_pages, table, lens_t, splits, block_n=16,
                           out=torch.full_like(q, float("nan")), counters=counters)
        ok_counts = counters is None or not counters.any()     # the last program put every count back
        err = (out.double() - reference(q, k_pages, v_pages, tables, lens).to(out.device)).abs().max().item()
        ok = bool(torch.isfinite(out).all()) and err <= tolerance and bool(ok_counts)
        results.append({"setting": {"batch": B, "heads": heads, "kv_heads": kv, "head_dim": d, "page": page,
                                    "context_lens": lens, "num_splits": splits, "fused_combine": fused},
                        "metrics": {"max_abs_err": err, "tolerance": tolerance}, "ok": ok})
        print(f"[kernel] check B={B} H={heads} KV={kv} D={d} page={page} lens={lens} splits={splits} "
              f"fused={int(fused)}: "
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


def implementations(case, splits: int) -> dict:
    """Name -> a call on the same inputs: ours at `splits` and at one split, FlashAttention 4 (if
    installed), the reference."""
    q, k_pages, v_pages, _, table, lens = case
    impls = {"triton": lambda: paged_decode(q, k_pages, v_pages, table, lens, splits),
             "triton 1 split": lambda: paged_decode(q, k_pages, v_pages, table, lens, 1)}
    if splits > 1:          # the combine as the split kernel's programmatic dependent (off in the engine)
        impls["triton PDL"] = lambda: paged_decode(q, k_pages, v_pages, table, lens, splits, pdl=True)
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


def time_grid(device: str, copy_bytes_per_s: float, preset: str, D: int) -> list[dict]:
    """Every (context, batch, page) of one head shape whose K/V fits MAX_KV_BYTES, every implementation."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    results = []
    for context, B, page in ((c, b, p) for c in CONTEXTS for b in BATCHES for p in PAGES):
        if 2 * B * context * KV * D * 2 <= MAX_KV_BYTES:
            splits = choose_num_splits(B, KV, sms, context, D)
            results += time_case(device, preset, D, B, context, page, splits, copy_bytes_per_s)
    return results


def time_case(device: str, preset: str, D: int, B: int, context: int, page: int, splits: int,
              copy_bytes_per_s: float) -> list[dict]:
    """One input (B sequences of `context` tokens in pages of `page`), each implementation."""
    case = random_case(B, H, KV, D, page, [context] * B, device, torch.bfloat16)
    kv_bytes = 2 * B * context * KV * D * 2                      # K and V, bf16, read once
    results = []
    for name, fn in implementations(case, splits).items():
        try:
            us, timer = timed_us(fn)
        except Exception as e:              # FlashAttention 4 refuses some shapes (page sizes, say): say so
            if name != "flash-attn":
                raise
            print(f"[kernel] {preset} flash-attn B={B} context={context} page={page}: {type(e).__name__}: "
                  f"{str(e).splitlines()[0][:120] if str(e) else ''}", flush=True)
            continue
        gb_s = kv_bytes / (us * 1e-6) / 1e9
        results.append({"engine": name, "preset": preset,
                        "setting": {"batch": B, "context": context, "page": page, "heads": H, "kv_heads": KV,
                                    "head_dim": D, "num_splits": splits if name in ("triton", "triton PDL") else 1},
                        "metrics": {"us": us, "kv_gb_s": gb_s, "copy_frac": gb_s * 1e9 / copy_bytes_per_s},
                        "timer": timer})
        print(f"[kernel] {preset} {name:<14} B={B:<3} context={context:<6} page={page:<4} S={splits:<3} "
              f"{us:9.1f} us {gb_s:7.0f} GB/s of K/V ({100 * results[-1]['metrics']['copy_frac']:.0f}% of copy)",
              flush=True)
    del case
    torch.cuda.empty_cache()
    return results


# The sweep the launch constants come from (`make phase-NN bench PART=kernel-tune`): batch 1 at 32k
# keys (the goal's shape), batch 1 at 4k (short: fixed costs show) and batch 64 at 4k (one split:
# must not regress), each launch configuration at the split counts of 1, 2, 4 and 8 waves, with the
# combine as its own kernel and fused into the split kernel's last program (at S > 1). The first
# H200 sweep's top five of every shape used 2 or 4 warps and 2 or 3 stages but one (llama-8b at
# batch 1 / 4k: 1 stage, 3% ahead of 2): 8 warps and 1 stage left the grid to make room for fusion.
TUNE_SHAPES = ((1, 32768), (1, 4096), (64, 4096))
TUNE_LAUNCH = [(n, w, st) for n in (32, 64, 128) for w in (2, 4) for st in (2, 3)]
TUNE_WAVES = (1, 2, 4, 8)


def tune(device: str, copy_bytes_per_s: float, save) -> list[dict]:
    """Every (block_n, num_warps, num_stages) x split count x combine on TUNE_SHAPES, both head
    shapes, page 16."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    results = []
    for (preset, D), (B, context) in ((h, s) for h in HEAD_DIMS.items() for s in TUNE_SHAPES):
        case = random_case(B, H, KV, D, 16, [context] * B, device, torch.bfloat16)
        counters = alloc_counters(B, KV, device)
        kv_bytes = 2 * B * context * KV * D * 2
        for block_n, warps, stages in TUNE_LAUNCH:
            splits = sorted({choose_num_splits(B, KV, sms, context, D, block_n, waves=w, max_splits=1024)
                             for w in TUNE_WAVES})
            for S, fused in ((S, f) for S in splits for f in (False, True) if S > 1 or not f):
                setting = {"batch": B, "context": context, "page": 16, "head_dim": D, "block_n": block_n,
                           "num_warps": warps, "num_stages": stages, "num_splits": S, "fused_combine": fused}
                row = tune_one(case, setting, counters if fused else None, kv_bytes, copy_bytes_per_s)
                if row:
                    results.append({"engine": "triton", "preset": preset, **row})
                print(f"[tune] {preset} B={B} ctx={context} n={block_n} w={warps} st={stages} S={S} "
                      f"fused={int(fused)}: " + (f"{row['metrics']['us']:8.1f} us {100 * row['metrics']['copy_frac']:5.1f}%"
                                                 f"{'' if row['ok'] else ' WRONG OUTPUT'}" if row else "does not compile"),
                      flush=True)
        del case
        torch.cuda.empty_cache()
        save(results)                            # after each shape: a sweep cut short keeps what it timed
    print_best(results)
    return results


def tune_one(case, setting: dict, counters, kv_bytes: int, copy_bytes_per_s: float) -> dict | None:
    """One launch configuration timed on one input: {"timer", "setting", "metrics"}, or None where
    it does not compile (too much shared memory, say)."""
    q, k_pages, v_pages, _, table, lens = case

    def call():
        return paged_decode(q, k_pages, v_pages, table, lens, setting["num_splits"], setting["block_n"],
                            num_warps=setting["num_warps"], num_stages=setting["num_stages"], counters=counters)
    try:
        us, timer = timed_us(call)
    except Exception:
        return None
    # after the replays, one more call checked against the default launch (fused: every last
    # program must have seen every partial its group wrote, on the real GPU's memory ordering)
    err = (call().float() - paged_decode(q, k_pages, v_pages, table, lens, setting["num_splits"]).float()).abs().max().item()
    return {"timer": timer, "setting": setting, "ok": err <= 2e-2,
            "metrics": {"us": us, "copy_frac": kv_bytes / (us * 1e-6) / copy_bytes_per_s, "max_abs_err": err}}


def print_best(results: list[dict], top: int = 5) -> None:
    """The fastest configurations of each shape, and where the current defaults land."""
    keys = sorted({(r["preset"], r["setting"]["batch"], r["setting"]["context"]) for r in results})
    for preset, B, context in keys:
        rows = sorted((r for r in results if (r["preset"], r["setting"]["batch"], r["setting"]["context"])
                       == (preset, B, context) and r.get("ok", True)), key=lambda r: r["metrics"]["us"])
        print(f"== {preset} batch {B} context {context}")
        for r in rows[:top]:
            s = r["setting"]
            print(f"   n={s['block_n']:<4} w={s['num_warps']} st={s['num_stages']} S={s['num_splits']:<4} "
                  f"fused={int(s.get('fused_combine', False))} "
                  f"{r['metrics']['us']:8.1f} us {100 * r['metrics']['copy_frac']:5.1f}%")


def main(argv: list[str] | None = None, make_command: str | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check-only", action="store_true", help="skip the timings")
    p.add_argument("--tune", action="store_true", help="time the launch configurations instead (GPU)")
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
    out = RESULTS / PHASE / f"kernel-{device_tag(name)}.json"
    if device == "cuda" and args.tune:
        hw = roofline.measure(device)
        path = RESULTS / PHASE / f"kernel-tune-{device_tag(name)}.json"
        tune(device, hw["copy_bytes_per_s"],
             lambda rows: write_records(path, [base | {"workload": "kernel-tune", "hardware": hw, **r} for r in rows],
                                          sweep=True))
        return
    if device == "cuda" and not args.check_only:
        hw = roofline.measure(device)
        for preset, D in HEAD_DIMS.items():      # written after each shape: a cut-short sweep keeps what it timed
            write_records(out, records, sweep=True)
            records += [base | {"workload": "kernel", "hardware": hw, **r}
                        for r in time_grid(device, hw["copy_bytes_per_s"], preset, D)]
    write_records(out, records, sweep=True)


if __name__ == "__main__":
    main(sys.argv[1:])
