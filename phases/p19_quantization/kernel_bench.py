"""`make phase-NN kernel` (and the bench's "gemm" part): check the int8 kernels, then time every GEMM.

1. Check: the Triton quantizer against quant.quantize_int8 (bit for bit), the Triton int8 GEMM
   against torch._int_mm + the same epilogue (int32 exact: equal up to the epilogue's fp32
   rounding), on awkward shapes (M = 1, 3, 17, 33; N and K not multiples of any tile), with and
   without a bias, under every tile shape the sweep times; the quantizing norm and SiLU * up
   against the kernel and the quantizer each fuses, bit for bit; the Triton GEMM on e4m3 against the
   dequantized product. On a GPU also the fp8 quantizer (the interpreter's e4m3 cast is not the
   GPU's) and torch._scaled_mm.
2. Time (GPU): llama-1b's and llama-8b's four Linears of a layer (q/k/v, o, gate/up, down) at
   M = 1 ... 4096 tokens: bf16 F.linear (twice: the A/A control), the GEMMs alone on quantized
   input (Triton on int8, and on e4m3 up to M = 64; torch._int_mm with and without its epilogue;
   torch._scaled_mm), the per-token quantizers alone, and the Linear as the engine runs it (quantizer + the GEMM its
   rule picks). Each call replayed from a CUDA graph (as a decode step runs it), REPEATS rounds in
   rotated order; a round's ratio is taken against the same round's bf16. TFLOP/s = 2MNK / time;
   GB/s = the weight's bytes / time for a GEMM (bf16: 2NK, int8/fp8: NK), the activation's for a
   quantizer (bf16 in, 8 bits out: 3MK), against the copy bandwidth measured in the same run.
   Beside q/k/v the add + RMSNorm before it, beside down SiLU * up: alone, followed by the
   quantizer, and quantizing their own rows (one kernel each, what the engine runs). At M = 1 the Triton kernel's tile shapes are swept
   too ("triton BN=.. BK=..": the data the tile rule answers to).
Writes results/<phase>/gemm-<device>.json and prints, last, a layer's four Linears summed per M.
"""
from __future__ import annotations

import argparse
import os
import sys
import uuid

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")       # before triton is first imported

from common import roofline                               # noqa: E402
from common.device import device_name                     # noqa: E402
from common.loader import resolve                         # noqa: E402
from common.results import RESULTS, device_tag, provenance, write_records   # noqa: E402
from common.stats import summarize                        # noqa: E402

from . import quant                                       # noqa: E402
from .triton_int8 import quantize_rows, w8a8_gemm        # noqa: E402

PHASE = __package__.split(".")[-1]
CHECK_SHAPES = [(1, 77, 300), (3, 130, 520), (17, 64, 96), (33, 200, 1000)]   # (M, N, K)
TILES = [dict(BLOCK_M=16, BLOCK_N=n, BLOCK_K=k, num_warps=w, num_stages=s)    # swept at M <= 16
         for n, k, w, s in ((16, 512, 4, 4), (32, 256, 4, 4), (32, 512, 4, 3), (64, 256, 4, 4), (64, 128, 4, 4),
                            (16, 1024, 4, 3), (32, 1024, 4, 3), (64, 512, 4, 3), (32, 512, 8, 3))]
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
PRESETS = ("llama-1b", "llama-8b")
REPEATS = 3


def linear_shapes(preset: str) -> dict[str, tuple[int, int]]:
    """A layer's four Linears as (N, K), from the preset's shapes."""
    c = resolve(preset).config
    return {"qkv": ((c.num_heads + 2 * c.num_kv_heads) * c.head_dim, c.hidden_size),
            "o": (c.hidden_size, c.num_heads * c.head_dim),
            "gate_up": (2 * c.intermediate_size, c.hidden_size), "down": (c.hidden_size, c.intermediate_size)}


def check(device: str) -> list[dict]:
    """In the interpreter (CPU) the quantizer must be bit-exact; a GPU's fp32 division may round
    a value that sits on a rounding boundary the other way: one count, on a few values at most."""
    results = []
    for M, N, K in CHECK_SHAPES:
        x, w = 3 * torch.randn(M, K, device=device), torch.randn(N, K, device=device) / K ** 0.5
        x[:, 0] *= 40                                              # an outlier channel, as LLMs have
        wq, ws = quant.quantize_int8(w)
        xq, xs = quantize_rows(x, torch.int8, quant.INT8_MAX)
        ref_q, ref_s = quant.quantize_int8(x)
        off = (xq.int() - ref_q.int()).abs()
        ok_quant = off.max().item() <= (0 if device == "cpu" else 1) and (off > 0).float().mean().item() <= 1e-3 \
            and ((xs - ref_s).abs() <= 1e-6 * ref_s).all().item()
        bias = torch.randn(N, device=device)
        for b in (None, bias):
            exact = xq.cpu().long().matmul(wq.cpu().long().t()).to(device)          # int64: no rounding
            ref = quant.epilogue(exact, xs, ws.view(-1), b, torch.float32)
            for tile in [None, *TILES]:
                got = w8a8_gemm(xq, xs, wq, ws.view(-1), b, torch.float32, tile)
                err = ((got - ref).abs().max() / ref.abs().max()).item()           # the epilogue's fp32 rounding
                results.append({"setting": {"M": M, "N": N, "K": K, "bias": b is not None, "tile": tile or "rule"},
                                "metrics": {"max_err_frac": err, "quantizer_ok": ok_quant}, "ok": ok_quant and err < 1e-5})
        print(f"[kernel] check M={M} N={N} K={K}: quantizer {'ok' if ok_quant else 'DIFFERS'}, GEMM max error "
              f"{max(r['metrics']['max_err_frac'] for r in results[-2 * (1 + len(TILES)):]):.1e} of the largest "
              f"output", flush=True)
    results += check_norm(device)
    if device == "cpu" or torch.cuda.get_device_capability() >= (8, 9):       # e4m3 needs SM 8.9+
        results += check_fp8(device)
    return results


def check_norm(device: str) -> list[dict]:
    """The quantizing norm (add + RMSNorm + per-token int8 in one kernel) and SiLU * up against the
    two kernels each replaces, bit for bit: the same arithmetic in the same order."""
    from .fused_elementwise import add_rms_norm, silu_and_mul
    results = []
    dtype = torch.bfloat16 if device == "cuda" else torch.float32          # the model's dtype there
    for T, dim in ((3, 300), (17, 576)):
        x, res = torch.randn(T, dim, device=device, dtype=dtype), 10 * torch.randn(T, dim, device=device, dtype=dtype)
        w = torch.rand(dim, device=device, dtype=dtype)
        fused_res, plain_res = res.clone(), res.clone()
        q, scale = add_rms_norm(x, fused_res, w, 1e-5, (torch.int8, quant.INT8_MAX))
        ref_q, ref_scale = quantize_rows(add_rms_norm(x, plain_res, w, 1e-5), torch.int8, quant.INT8_MAX)
        ok = bool(torch.equal(q, ref_q) and torch.equal(scale, ref_scale) and torch.equal(fused_res, plain_res))
        results.append({"setting": {"T": T, "dim": dim, "norm": True}, "metrics": {"exact": ok}, "ok": ok})
        gate_up = torch.randn(T, 2 * dim, device=device, dtype=dtype)
        q, scale = silu_and_mul(gate_up, (torch.int8, quant.INT8_MAX))
        ref_q, ref_scale = quantize_rows(silu_and_mul(gate_up), torch.int8, quant.INT8_MAX)
        silu_ok = bool(torch.equal(q, ref_q) and torch.equal(scale, ref_scale))
        results.append({"setting": {"T": T, "dim": dim, "silu": True}, "metrics": {"exact": silu_ok}, "ok": silu_ok})
        print(f"[kernel] check the quantizing norm and SiLU * up T={T} dim={dim}: "
              f"{'exact' if ok else 'DIFFERS'}, {'exact' if silu_ok else 'DIFFERS'}", flush=True)
    return results


def check_fp8(device: str) -> list[dict]:
    """The Triton GEMM on e4m3 against the dequantized product (in the interpreter too: its inputs
    from torch's cast there); on a GPU also the fp8 quantizer against torch's cast and
    torch._scaled_mm (quant.fp8_matmul's path above TRITON_MAX_M)."""
    x, w = torch.randn(33, 512, device=device), torch.randn(256, 512, device=device) / 512 ** 0.5
    ref_q, ref_s = quant.quantize_fp8(x.bfloat16())
    xq, xs = quantize_rows(x.bfloat16(), torch.float8_e4m3fn, quant.FP8_MAX) if device == "cuda" else (ref_q, ref_s)
    same = (xq.float() == ref_q.float()).float().mean().item()
    wq, ws = quant.quantize_fp8(w)
    gemms = {"triton": lambda M: w8a8_gemm(xq[:M], xs[:M], wq, ws.view(-1), None, torch.bfloat16)}
    if device == "cuda":
        gemms["_scaled_mm"] = lambda M: quant.fp8_matmul(xq[:M], xs[:M], wq, ws.view(-1), None, torch.bfloat16)
    results = []
    for gemm, fn in gemms.items():
        for M in ((1, 3, 16, 33) if gemm == "triton" else (33,)):
            ref = quant.dequantize(xq[:M], xs[:M]) @ quant.dequantize(wq, ws).t()
            err = ((fn(M).float() - ref).abs().max() / ref.abs().max()).item()     # bf16 output: 2^-8
            results.append({"setting": {"M": M, "N": 256, "K": 512, "fp8": True, "gemm": gemm},
                            "metrics": {"quantizer_equal_frac": same, "max_err_frac": err},
                            "ok": same > 0.999 and err < 1e-2})
    print(f"[kernel] fp8: quantizer equal to torch's cast on {100 * same:.2f}% of values, GEMMs' max error "
          f"{max(r['metrics']['max_err_frac'] for r in results):.1e} of the largest output", flush=True)
    return results


def producer_variants(shape: str, M: int, K: int, device: str) -> dict:
    """The kernel that makes a Linear's input at M rows: before q/k/v the add + RMSNorm, before down
    SiLU * up. Alone (bf16 out), then the quantizer after it, and quantizing its own rows (one
    kernel: what the engine runs)."""
    from .fused_elementwise import add_rms_norm, silu_and_mul
    int8 = (torch.int8, quant.INT8_MAX)
    if shape == "qkv":
        x, res = torch.randn(M, K, device=device, dtype=torch.bfloat16), torch.randn(M, K, device=device, dtype=torch.bfloat16)
        w = torch.ones(K, device=device, dtype=torch.bfloat16)
        make, moved = (lambda *q: add_rms_norm(x, res, w, 1e-5, *q)), 6 * M * K    # x, res in; res, out written
    else:
        gate_up = torch.randn(M, 2 * K, device=device, dtype=torch.bfloat16)
        make, moved = (lambda *q: silu_and_mul(gate_up, *q)), 6 * M * K           # 2K in, K out
    name = {"qkv": "norm", "down": "silu*up"}[shape]
    return {f"{name} bf16": (make, moved),
            f"{name} then quantize int8": (lambda: quantize_rows(make(), *int8), moved + 3 * M * K),
            f"{name} quantizing int8": (lambda: make(int8), moved - M * K)}


def variants(M: int, N: int, K: int, device: str, fp8_ok: bool) -> dict:
    """name -> (a call, the bytes it must move: a GEMM's weight, a quantizer's bf16 in and int8 out,
    a norm's rows read and written)."""
    x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=device, dtype=torch.bfloat16) / K ** 0.5
    lin = quant.QuantLinear(w.float(), None, fp8=False)
    xq, xs = quantize_rows(x, torch.int8, quant.INT8_MAX)
    wq, ws = lin.weight, lin.weight_scale
    calls = {"bf16": (lambda: F.linear(x, w), 2 * N * K), "bf16#2": (lambda: F.linear(x, w), 2 * N * K),
             "w8a8 linear": (lambda: lin(x), N * K),
             "quantize int8": (lambda: quantize_rows(x, torch.int8, quant.INT8_MAX), 3 * M * K),
             "int8 triton": (lambda: w8a8_gemm(xq, xs, wq, ws, None, torch.bfloat16), N * K)}
    if M > 16:                                                   # cuBLASLt's int8 GEMM needs M > 16
        calls["int8 _int_mm"] = (lambda: quant.epilogue(torch._int_mm(xq, wq.t()), xs, ws, None, torch.bfloat16), N * K)
    if M in (32, 256, 4096):                                     # what torch's epilogue costs
        calls["int8 _int_mm no epilogue"] = (lambda: torch._int_mm(xq, wq.t()), N * K)
    if M == 1:
        for tile in TILES:
            calls[f"triton BN={tile['BLOCK_N']} BK={tile['BLOCK_K']} st={tile['num_stages']} w={tile['num_warps']}"] = (
                lambda tile=tile: w8a8_gemm(xq, xs, wq, ws, None, torch.bfloat16, tile), N * K)
    if fp8_ok:
        lin8 = quant.QuantLinear(w.float(), None, fp8=True)
        x8, s8 = quantize_rows(x, torch.float8_e4m3fn, quant.FP8_MAX)
        calls["fp8 linear"] = (lambda: lin8(x), N * K)
        calls["quantize fp8"] = (lambda: quantize_rows(x, torch.float8_e4m3fn, quant.FP8_MAX), 3 * M * K)
        calls["fp8 _scaled_mm"] = (lambda: torch._scaled_mm(x8, lin8.weight.t(), scale_a=s8,
                                                             scale_b=lin8.weight_scale.view(1, -1),
                                                             out_dtype=torch.bfloat16), N * K)
        if M <= 64:                                              # where the rule's crossover lies
            calls["fp8 triton"] = (lambda: w8a8_gemm(x8, s8, lin8.weight, lin8.weight_scale, None,
                                                     torch.bfloat16), N * K)
    return calls


def time_grid(device: str, presets: list[str], hw: dict, fp8_ok: bool, run: dict, done) -> list[dict]:
    """Every preset's shapes; done(records) after each preset (a timeout keeps the presets before)."""
    import time
    import triton.testing
    copy_bytes_per_s, start, records = hw["copy_bytes_per_s"], time.perf_counter(), []
    for preset in presets:
        for shape, (N, K) in linear_shapes(preset).items():
            for M in ROWS:
                calls = variants(M, N, K, device, fp8_ok) | \
                    (producer_variants(shape, M, K, device) if shape in ("qkv", "down") else {})
                samples = {name: [] for name in calls}
                for rep in range(REPEATS):
                    names = list(calls)
                    names = names[rep % len(names):] + names[:rep % len(names)]   # rotated rounds
                    for name in names:
                        fn, moved = calls[name]
                        us = 1e3 * triton.testing.do_bench_cudagraph(fn, rep=3, return_mode="median")
                        sample = {"repeat": rep, "us": us, "gb_s": moved / us / 1e3,
                                  "copy_frac": moved / (us * 1e-6) / copy_bytes_per_s}
                        if not name.startswith(("quantize", "norm", "silu")):
                            sample["tflop_s"] = 2 * M * N * K / us / 1e6
                        samples[name].append(sample)
                for name, s in samples.items():
                    records.append(record(name, preset, shape, M, N, K, s, device, run))
                print(f"[gemm] {time.perf_counter() - start:5.0f} s {preset} {shape:<7} M={M:<5} " + "  ".join(
                    f"{n} {summarize(s)[0]['us']:.1f}" for n, s in samples.items() if not n.startswith("triton BN")),
                    flush=True)
                del calls
                torch.cuda.empty_cache()
        done([r | {"hardware": hw} for r in records])
    return records


def record(name: str, preset: str, shape: str, M: int, N: int, K: int, samples: list[dict], device: str,
           run: dict) -> dict:
    metrics, spread = summarize(samples)
    dtype = "bfloat16" if name.startswith("bf16") else ("float8_e4m3fn" if "fp8" in name else "int8")
    return {"phase": PHASE, "engine": name, "workload": "gemm", "preset": preset, "dtype": dtype, "scale": "full",
            "setting": {"linear": shape, "M": M, "N": N, "K": K}, "device": device_name(device),
            "timer": "cudagraph", "run_id": run["run_id"], "part": run["part"], "repeats": len(samples),
            "metrics": metrics, "spread": spread, "samples": samples,
            "provenance": provenance(device_name(device)) | {"make_command": run["make_command"]}}


def layer_table(records: list[dict], presets: list[str]) -> None:
    """A layer's four Linears summed, per preset and M: bf16 us, and each path's speed-up over it."""
    cols = ["bf16#2", "w8a8 linear", "int8 triton", "int8 _int_mm", "fp8 linear", "fp8 triton", "fp8 _scaled_mm",
            "quantize int8", "fusion saves"]
    by = {}
    for r in records:
        if r["workload"] == "gemm":
            key = (r["preset"], r["setting"]["M"], r["engine"])
            by[key] = by.get(key, 0.0) + r["metrics"]["us"]
    for (preset, M, name), us in list(by.items()):         # what fusing saves: the norm's and SiLU * up's
        for producer in ("norm", "silu*up"):
            if name == f"{producer} then quantize int8" and (preset, M, f"{producer} quantizing int8") in by:
                by[(preset, M, "fusion saves")] = by.get((preset, M, "fusion saves"), 0.0) + us \
                    - by[(preset, M, f"{producer} quantizing int8")]
    microseconds = ("quantize int8", "fusion saves")
    print("\n| preset | M | bf16 us (4 Linears) | " + " | ".join(f"{c} us" if c in microseconds else f"{c} x"
                                                              for c in cols) + " |")
    print("|" + " --- |" * (3 + len(cols)))
    for preset in presets:
        for M in ROWS:
            base = by.get((preset, M, "bf16"))
            if base is None:
                continue
            cells = [f"{by[(preset, M, c)]:.1f}" if c in microseconds else f"{base / by[(preset, M, c)]:.2f}"
                     if (preset, M, c) in by else "-" for c in cols]
            print(f"| {preset} | {M} | {base:.1f} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None, make_command: str | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check-only", action="store_true", help="skip the timings")
    p.add_argument("--presets", default=",".join(PRESETS), help="the shapes timed (comma-separated presets)")
    args, _ = p.parse_known_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    checks = check(device)
    if not all(c["ok"] for c in checks):
        raise SystemExit("[kernel] a kernel disagrees with its reference: no timings taken")
    name = device_name(device)
    run = {"run_id": uuid.uuid4().hex[:12], "part": "gemm",
           "make_command": make_command or f"make phase-{PHASE[1:3]} kernel"}
    base = {"phase": PHASE, "preset": "awkward", "dtype": "int8", "scale": "full", "device": name,
            "run_id": run["run_id"], "part": run["part"],
            "provenance": provenance(name) | {"make_command": run["make_command"]}}
    records = [base | {"engine": "triton", "workload": "gemm-check", **c} for c in checks]
    out = RESULTS / PHASE / f"gemm-{device_tag(name)}.json"
    if device == "cuda" and not args.check_only:
        fp8_ok = torch.cuda.get_device_capability() >= (8, 9)
        if not fp8_ok:
            print(f"[gemm] {name} is below SM 8.9: no fp8 (e4m3) GEMM; int8 and bf16 only", flush=True)
        hw = roofline.measure(device)
        checked = list(records)
        timed = time_grid(device, args.presets.split(","), hw, fp8_ok, run, lambda t: write_records(out, checked + t))
        records += [r | {"hardware": hw} for r in timed]
    write_records(out, records)
    layer_table(records, args.presets.split(","))
    print(f"[gemm] run {run['run_id']}: wrote {len(records)} records to {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
