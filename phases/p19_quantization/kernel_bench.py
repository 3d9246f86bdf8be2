"""`make phase-NN kernel` (and the bench's "gemm" part): check the int8 kernels, then time every GEMM.

1. Check: the Triton quantizer against quant.quantize_int8 (bit for bit), the Triton int8 GEMM
   against int64 sums + torch's epilogue (int32 exact: in the interpreter equal, bit for bit; on a
   GPU up to the epilogue's fp32 rounding), on awkward shapes (M = 1, 3, 17, 33; N and K not
   multiples of any tile), with and without a bias, under its rule; every decode candidate the sweep
   times (tiles, split-K, GEMV) the same way at M = 1, 3, 16, in int8 and e4m3; the quantizing norm
   and SiLU * up against the kernel and the quantizer each fuses, bit for bit; the GEMV quantizing
   its own float rows against quantize_rows + the GEMV, bit for bit (every GEMV candidate, M = 1..4,
   a zero row); the Triton GEMM on e4m3 against the dequantized product. On a GPU also the fp8
   quantizer (the interpreter's e4m3 cast is not the GPU's) and torch._scaled_mm.
2. Time (GPU): llama-1b's and llama-8b's four Linears of a layer (q/k/v, o, gate/up, down) at
   M = 1 ... 4096 tokens: bf16 F.linear (twice: the A/A control), the GEMMs alone on quantized
   input (Triton on int8, and on e4m3 up to M = 64; torch._int_mm with and without its epilogue;
   torch._scaled_mm), the per-token quantizers alone, and the Linear on a float input as
   QuantLinear runs it ("w8a8 linear": the quantizer + the GEMM its rule picks; where that is the
   GEMV, the GEMV quantizing its input itself). Each call replayed from a CUDA graph (as a decode
   step runs it), REPEATS rounds in rotated order; a round's ratio is taken against the same
   round's bf16. Every GEMM reads its weight cold, from a copy the L2 cache does not hold
   (weight_copies), as a decode step does.
   TFLOP/s = 2MNK / time; GB/s = the weight's bytes / time for a GEMM (bf16: 2NK, int8/fp8: NK),
   the activation's for a quantizer (bf16 in, 8 bits out: 3MK), against the copy bandwidth
   measured in the same run.
   Beside q/k/v the add + RMSNorm before it, beside down SiLU * up: alone, followed by the
   quantizer, and quantizing their own rows (one kernel each, what the engine runs); beside o at
   M = 1 (where its rule picks the GEMV) quantize_rows + the GEMV ("quantize then gemv int8")
   against the GEMV quantizing its own rows ("gemv quantizing int8", what the engine runs); the
   layer table's "fusion saves" sums the three. At M = 1, 4 and 16 (DECODE_ROWS) the decode
   candidates are swept too, on int8: the tensor-core tiles ("triton BN=.. BK=..": the data the
   tile rule answers to), split-K ("... split=S") and the CUDA-core GEMV ("gemv ...", M <= 4).
Writes results/<phase>/gemm-<device>.json and prints, last, a layer's four Linears summed per M, then
per shape and decode M the current choice against the fastest candidate, and the DECODE_TABLE
entries (triton_int8.py) that would take the winners.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import uuid
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")       # before triton is first imported

from common import roofline                               # noqa: E402
from common.device import device_name                     # noqa: E402
from common.loader import resolve                         # noqa: E402
from common.results import (RESULTS, device_tag, history_path, provenance, read_list, write_json,   # noqa: E402
                            write_records)
from common.stats import summarize                        # noqa: E402

from . import quant                                       # noqa: E402
from .triton_int8 import (GEMV_MAX_M, gemm_config, quantize_rows, w8a8_gemm,   # noqa: E402
                          w8a8_gemv_quantizing)

PHASE = __package__.split(".")[-1]
CHECK_SHAPES = [(1, 77, 300), (3, 130, 520), (17, 64, 96), (33, 200, 1000)]   # the rule's (M, N, K)
# The decode candidates' (M, N, K), and the one setting (e4m3?, bias?) a GPU checks each at (see check_decode)
DECODE_CHECK = [((1, 77, 300), (False, True)), ((3, 130, 1000), (True, False)), ((16, 40, 520), (False, False))]
# The decode candidates, timed at every M of DECODE_ROWS beside the rule ("int8 triton") on the same
# data. Tensor-core tiles: (BLOCK_N, BLOCK_K, warps, stages). (32, 256, 4, 4) is no longer swept: in
# gemm-h100.json it was never the fastest at M = 1, and (32, 512, 4, 3) ran at or below it on 7 of
# the 8 shapes (0.4% above on the 8th, both 19% behind that shape's best).
TILES = [dict(BLOCK_M=16, BLOCK_N=n, BLOCK_K=k, num_warps=w, num_stages=s)
         for n, k, w, s in ((16, 512, 4, 4), (32, 512, 4, 3), (64, 256, 4, 4), (64, 128, 4, 4),
                            (16, 1024, 4, 3), (32, 1024, 4, 3), (64, 512, 4, 3), (32, 512, 8, 3))]
# split-K on the tensor cores: (BLOCK_N, BLOCK_K, SPLIT_K, stages), for a long K against a short N (down)
SPLITS = [dict(BLOCK_M=16, BLOCK_N=n, BLOCK_K=k, SPLIT_K=sk, num_warps=4, num_stages=s)
          for n, k, sk, s in ((16, 512, 2, 4), (32, 512, 2, 3), (32, 512, 4, 3), (64, 256, 4, 4), (64, 256, 8, 4))]
# the CUDA cores' GEMV (M <= GEMV_MAX_M): (BLOCK_N, BLOCK_K, SPLIT_K, stages); N tiles of 4 and 8
# the tensor cores cannot take
GEMVS = [dict(kernel="gemv", BLOCK_N=n, BLOCK_K=k, SPLIT_K=sk, num_warps=4, num_stages=s)
         for n, k, sk, s in ((4, 1024, 1, 1), (8, 512, 1, 1), (8, 1024, 1, 1), (16, 512, 1, 1), (8, 512, 1, 3),
                             (8, 512, 2, 1))]
# The quantizing GEMV's (M, N, K, bias?, a zero row?): every M it takes, N and K not multiples of
# the tiles (K = 1100 a few BLOCK_K steps on a GPU too); checked with every GEMV candidate
QUANTIZING_CHECK = [(1, 37, 300, False, False), (2, 40, 1100, True, True), (3, 21, 300, True, False),
                    (4, 37, 1100, False, True)]
DECODE_ROWS = (1, 4, 16)     # a decode bucket's rows the candidates are timed at: DECODE_TABLE's bounds
PICK_MARGIN = 0.02           # a candidate must beat the current choice by this to be suggested (bf16's A/A
                             # medians at M <= 16 in gemm-h100.json: within 1% on 39 of 40 (shape, M))
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
PRESETS = ("llama-1b", "llama-8b")
REPEATS = 3


def tile_name(config: dict) -> str:
    """A candidate's record name: "triton BN=32 BK=512 st=3 w=4" (a tensor-core tile, as the
    records have always named it), "gemv ..." for the CUDA-core kernel, " split=4" after either."""
    kernel = "gemv" if config.get("kernel") == "gemv" else "triton"
    name = f"{kernel} BN={config['BLOCK_N']} BK={config['BLOCK_K']} st={config['num_stages']} w={config['num_warps']}"
    return name + (f" split={config['SPLIT_K']}" if config.get("SPLIT_K", 1) > 1 else "")


CANDIDATES = {tile_name(c): c for c in TILES + SPLITS + GEMVS}


def takes(config: dict, M: int) -> bool:
    """Whether a config runs at M rows: the GEMV holds at most GEMV_MAX_M."""
    return config.get("kernel") != "gemv" or M <= GEMV_MAX_M


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
            got = w8a8_gemm(xq, xs, wq, ws.view(-1), b, torch.float32)
            err = int8_error(xq, xs, wq, ws, b, got)
            results.append({"setting": {"M": M, "N": N, "K": K, "bias": b is not None, "tile": "rule"},
                            "metrics": {"max_err_frac": err, "quantizer_ok": ok_quant},
                            "ok": ok_quant and int8_ok(err, device)})
        print(f"[kernel] check M={M} N={N} K={K}: quantizer {'ok' if ok_quant else 'DIFFERS'}, GEMM max error "
              f"{max(r['metrics']['max_err_frac'] for r in results[-2:]):.1e} of the largest output", flush=True)
    results += check_decode(device)
    results += check_norm(device)
    results += check_quantizing_gemv(device)
    if device == "cpu" or torch.cuda.get_device_capability() >= (8, 9):       # e4m3 needs SM 8.9+
        results += check_fp8(device)
    return results


def int8_error(xq, xs, wq, ws, bias, got) -> float:
    """The int8 GEMM's largest distance to int64 sums + torch's epilogue, over the largest output."""
    exact = xq.cpu().long().matmul(wq.cpu().long().t()).to(xq.device)              # int64: no rounding
    ref = quant.epilogue(exact, xs, ws.view(-1), bias, torch.float32)
    return ((got - ref).abs().max() / ref.abs().max()).item()


def int8_ok(err: float, device: str) -> bool:
    """The int32 sums are exact, so in the interpreter (the same fp32 operations in the same order as
    torch's epilogue) the output is too; a GPU's compiler may fuse the epilogue's multiply and add."""
    return err == 0.0 if device == "cpu" else err < 1e-5


def check_decode(device: str) -> list[dict]:
    """Every decode candidate (tile, split-K, GEMV) at DECODE_CHECK's shapes up to its rows: int8
    against the exact sums (int8_ok), e4m3 against the dequantized product (check_fp8's bound). In
    the interpreter each shape with and without a bias, in both dtypes; on a GPU each shape in its one
    setting (every candidate compiles once per shape and setting, and the interpreter has run the
    same code on all of them)."""
    results = []
    fp8_runs = device == "cpu" or torch.cuda.get_device_capability() >= (8, 9)
    for (M, N, K), on_gpu in DECODE_CHECK:
        x, w = 3 * torch.randn(M, K, device=device), torch.randn(N, K, device=device) / K ** 0.5
        x[:, 0] *= 40
        bias = torch.randn(N, device=device)
        settings = [(fp8, b) for fp8 in (False, True) for b in (False, True)] if device == "cpu" else [on_gpu]
        for fp8, with_bias in settings:
            if fp8 and not fp8_runs:
                continue
            b = bias if with_bias else None
            if fp8:                                    # torch's cast on both devices (see check_fp8)
                (xq, xs), (wq, ws) = quant.quantize_fp8(x), quant.quantize_fp8(w)
                ref = quant.dequantize(xq, xs) @ quant.dequantize(wq, ws).t() + (0 if b is None else b)
            else:
                (xq, xs), (wq, ws) = quantize_rows(x, torch.int8, quant.INT8_MAX), quant.quantize_int8(w)
            for name, config in CANDIDATES.items():
                if not takes(config, M):
                    continue
                got = w8a8_gemm(xq, xs, wq, ws.view(-1), b, torch.bfloat16 if fp8 else torch.float32, config)
                if fp8:
                    err = ((got.float() - ref).abs().max() / ref.abs().max()).item()     # bf16 output: 2^-8
                    ok = err < 1e-2
                else:
                    err = int8_error(xq, xs, wq, ws, b, got)
                    ok = int8_ok(err, device)
                results.append({"setting": {"M": M, "N": N, "K": K, "bias": with_bias, "fp8": fp8, "tile": config},
                                "metrics": {"max_err_frac": err}, "ok": ok})
        mine = [r for r in results if r["setting"]["M"] == M]
        worst = {fp8: max((r["metrics"]["max_err_frac"] for r in mine if r["setting"]["fp8"] == fp8), default=None)
                 for fp8 in (False, True)}
        print(f"[kernel] check the decode candidates M={M} N={N} K={K}: {sum(r['ok'] for r in mine)} of {len(mine)} "
              "ok, max error " + ", ".join(f"{kind} {worst[fp8]:.1e}" for fp8, kind in ((False, "int8"), (True, "e4m3"))
                                          if worst[fp8] is not None), flush=True)
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


def check_quantizing_gemv(device: str) -> list[dict]:
    """The GEMV that quantizes its float rows itself against quantize_rows then the GEMV, bit for bit
    (the same math on the same values; on a GPU recorded, and held to check_decode's bounds), with
    every GEMV candidate at QUANTIZING_CHECK's shapes: in the interpreter int8 and e4m3 at each,
    on a GPU int8 at M = 1, 3 and e4m3 at M = 2, 4 (SM 8.9+). x bf16 at odd M, fp32 at even."""
    results = []
    fp8_runs = device == "cpu" or torch.cuda.get_device_capability() >= (8, 9)
    gemvs = {name: c for name, c in CANDIDATES.items() if c.get("kernel") == "gemv"}
    for M, N, K, with_bias, zero_row in QUANTIZING_CHECK:
        x = (3 * torch.randn(M, K, device=device)).to(torch.bfloat16 if M % 2 else torch.float32)
        if zero_row:
            x[-1] = 0
        w, bias = torch.randn(N, K, device=device) / K ** 0.5, torch.randn(N, device=device) if with_bias else None
        for fp8 in ((False, True) if device == "cpu" else (M % 2 == 0,)):
            if fp8 and not fp8_runs:
                continue
            dtype, qmax = (torch.float8_e4m3fn, quant.FP8_MAX) if fp8 else (torch.int8, quant.INT8_MAX)
            wq, ws = quant.quantize_fp8(w) if fp8 else quant.quantize_int8(w)
            for name, config in gemvs.items():
                ref = w8a8_gemm(*quantize_rows(x, dtype, qmax), wq, ws.view(-1), bias, torch.bfloat16, config)
                got = w8a8_gemv_quantizing(x, wq, ws.view(-1), bias, torch.bfloat16, qmax, config)
                exact = torch.equal(got, ref)
                err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                ok = exact if device == "cpu" else (err < 1e-2 if fp8 else int8_ok(err, device))
                results.append({"setting": {"M": M, "N": N, "K": K, "bias": with_bias, "zero_row": zero_row,
                                            "fp8": fp8, "x_dtype": str(x.dtype).removeprefix("torch."),
                                            "config": config, "quantizing_gemv": True},
                                "metrics": {"exact": exact, "max_err_frac": err}, "ok": ok})
        mine = [r for r in results if r["setting"]["M"] == M]
        print(f"[kernel] check the quantizing GEMV M={M} N={N} K={K}: {sum(r['metrics']['exact'] for r in mine)} "
              f"of {len(mine)} bit for bit equal to quantize_rows + the GEMV", flush=True)
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


def o_variants(shape: str, M: int, N: int, K: int, device: str, copies: list[Weights]) -> dict:
    """o, where gemm_config picks the GEMV (M = 1): its float input through quantize_rows then the
    GEMV (two launches), against the GEMV quantizing the rows itself (one: what the engine runs),
    both with the table's config and cold weights."""
    config = gemm_config(M, N, K)
    if shape != "o" or config.get("kernel") != "gemv":
        return {}
    x = torch.randn(M, K, device=device, dtype=torch.bfloat16)

    def separate(c: Weights) -> torch.Tensor:
        xq, xs = quantize_rows(x, torch.int8, quant.INT8_MAX)
        return w8a8_gemm(xq, xs, c.int8.weight, c.int8.weight_scale, None, torch.bfloat16, config)

    def quantizing(c: Weights) -> torch.Tensor:
        return w8a8_gemv_quantizing(x, c.int8.weight, c.int8.weight_scale, None, torch.bfloat16, quant.INT8_MAX, config)
    return {"quantize then gemv int8": (cold(separate, copies), N * K),
            "gemv quantizing int8": (cold(quantizing, copies), N * K)}


class Weights(NamedTuple):
    """One copy of a Linear's weight, in each form the timed calls read."""
    bf16: torch.Tensor                    # (N, K)
    int8: quant.QuantLinear
    fp8: quant.QuantLinear | None         # None below SM 8.9


def weight_copies(N: int, K: int, device: str, fp8_ok: bool) -> list[Weights]:
    """Enough copies of a (N, K) weight that their int8 bytes fill the L2 cache twice over. Each
    call reads the next copy (cold): as in a decode step, where every layer's weights are new,
    no call finds its weight in L2 from the call before. (Timed on one weight, qkv and o of
    llama-8b fit in an H100's 50 MB: earlier records read them faster than the copy bandwidth.)"""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    copies = []
    for _ in range(max(1, -(-2 * l2 // (N * K)))):
        w = torch.randn(N, K, device=device, dtype=torch.bfloat16) / K ** 0.5
        copies.append(Weights(w, quant.QuantLinear(w.float(), None, fp8=False),
                              quant.QuantLinear(w.float(), None, fp8=True) if fp8_ok else None))
    return copies


def cold(fn, copies: list[Weights]):
    """A call of fn(copy) on the next copy each time (see weight_copies)."""
    turn = itertools.cycle(copies)
    return lambda: fn(next(turn))


def variants(M: int, N: int, K: int, device: str, copies: list[Weights]) -> dict:
    """name -> (a call, the bytes it must move: a GEMM's weight, a quantizer's bf16 in and int8 out,
    a norm's rows read and written). Every GEMM reads its weight cold."""
    x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
    xq, xs = quantize_rows(x, torch.int8, quant.INT8_MAX)

    def int8_gemm(config=None):
        return cold(lambda c: w8a8_gemm(xq, xs, c.int8.weight, c.int8.weight_scale, None, torch.bfloat16, config),
                    copies)
    calls = {"bf16": (cold(lambda c: F.linear(x, c.bf16), copies), 2 * N * K),
             "bf16#2": (cold(lambda c: F.linear(x, c.bf16), copies), 2 * N * K),
             "w8a8 linear": (cold(lambda c: c.int8(x), copies), N * K),
             "quantize int8": (lambda: quantize_rows(x, torch.int8, quant.INT8_MAX), 3 * M * K),
             "int8 triton": (int8_gemm(), N * K)}
    if M > 16:                                                   # cuBLASLt's int8 GEMM needs M > 16
        def int_mm(c: Weights) -> torch.Tensor:
            return quant.epilogue(torch._int_mm(xq, c.int8.weight.t()), xs, c.int8.weight_scale, None, torch.bfloat16)
        calls["int8 _int_mm"] = (cold(int_mm, copies), N * K)
    if M in (32, 256, 4096):                                     # what torch's epilogue costs
        calls["int8 _int_mm no epilogue"] = (cold(lambda c: torch._int_mm(xq, c.int8.weight.t()), copies), N * K)
    if M in DECODE_ROWS:
        calls |= {name: (int8_gemm(config), N * K) for name, config in CANDIDATES.items() if takes(config, M)}
    if copies[0].fp8 is not None:
        x8, s8 = quantize_rows(x, torch.float8_e4m3fn, quant.FP8_MAX)
        calls["fp8 linear"] = (cold(lambda c: c.fp8(x), copies), N * K)
        calls["quantize fp8"] = (lambda: quantize_rows(x, torch.float8_e4m3fn, quant.FP8_MAX), 3 * M * K)
        calls["fp8 _scaled_mm"] = (cold(lambda c: torch._scaled_mm(x8, c.fp8.weight.t(), scale_a=s8,
                                                                   scale_b=c.fp8.weight_scale.view(1, -1),
                                                                   out_dtype=torch.bfloat16), copies), N * K)
        if M <= 64:                                              # where the rule's crossover lies
            calls["fp8 triton"] = (cold(lambda c: w8a8_gemm(x8, s8, c.fp8.weight, c.fp8.weight_scale, None,
                                                            torch.bfloat16), copies), N * K)
    return calls


def time_grid(device: str, presets: list[str], hw: dict, fp8_ok: bool, run: dict, done) -> list[dict]:
    """Every preset's shapes; done(records) after each preset (a timeout keeps the presets before)."""
    import time
    import triton.testing
    copy_bytes_per_s, start, records = hw["copy_bytes_per_s"], time.perf_counter(), []
    for preset in presets:
        for shape, (N, K) in linear_shapes(preset).items():
            copies = weight_copies(N, K, device, fp8_ok)
            for M in ROWS:
                calls = variants(M, N, K, device, copies) | o_variants(shape, M, N, K, device, copies) | \
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
                    f"{n} {summarize(s)[0]['us']:.1f}" for n, s in samples.items() if n not in CANDIDATES),
                    flush=True)
                del calls
                torch.cuda.empty_cache()
            del copies
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


# the separate kernels' record -> the fused kernel's: "fusion saves" is the sum of their differences
FUSED = {"norm then quantize int8": "norm quantizing int8", "silu*up then quantize int8": "silu*up quantizing int8",
         "quantize then gemv int8": "gemv quantizing int8"}


def layer_table(records: list[dict], presets: list[str]) -> None:
    """A layer's four Linears summed, per preset and M: bf16 us, and each path's speed-up over it."""
    cols = ["bf16#2", "w8a8 linear", "int8 triton", "int8 _int_mm", "fp8 linear", "fp8 triton", "fp8 _scaled_mm",
            "quantize int8", "fusion saves"]
    by = {}
    for r in records:
        if r["workload"] == "gemm":
            key = (r["preset"], r["setting"]["M"], r["engine"])
            by[key] = by.get(key, 0.0) + r["metrics"]["us"]
    for (preset, M, name), us in list(by.items()):         # what fusing saves: the norm's, SiLU * up's, o's GEMV's
        fused = (preset, M, FUSED.get(name))
        if fused in by:
            by[(preset, M, "fusion saves")] = by.get((preset, M, "fusion saves"), 0.0) + us - by[fused]
    microseconds = ("quantize int8", "fusion saves")
    print("\n| preset | M | bf16 us (4 Linears) | " + " | ".join(f"{c} us" if c in microseconds else f"{c} x"
                                                              for c in cols) + " |")
    print("|" + " --- |" * (3 + len(cols)))
    for preset in presets:
        for M in ROWS:
            base = by.get((preset, M, "bf16"))
            if base is None:
                continue
            cells = [(f"{by[(preset, M, c)]:.1f}" if c in microseconds else f"{base / by[(preset, M, c)]:.2f}")
                     if (preset, M, c) in by else "-" for c in cols]
            print(f"| {preset} | {M} | {base:.1f} | " + " | ".join(cells) + " |")


def decode_picks(records: list[dict]) -> None:
    """Per Linear shape and M of DECODE_ROWS: the current choice ("int8 triton": DECODE_TABLE's
    entry or the rule) against the fastest candidate, bf16's A/A beside; then the DECODE_TABLE
    entries (triton_int8.py) that would take the fastest, for each shape where one beats the
    current choice by more than PICK_MARGIN at some M (every bound then, so none falls to the rule)."""
    metrics = {(r["preset"], r["setting"]["linear"], r["setting"]["M"], r["engine"]): r["metrics"]
               for r in records if r["workload"] == "gemm"}
    shapes = {(r["preset"], r["setting"]["linear"]): (r["setting"]["N"], r["setting"]["K"])
              for r in records if r["workload"] == "gemm"}
    if not any(engine in CANDIDATES for *_, engine in metrics):
        return
    print("\n| preset | linear | N | K | M | current us | fastest candidate | us | x current | % of copy | bf16 A/A |")
    print("|" + " --- |" * 11)
    entries = {}
    for (preset, linear), (N, K) in shapes.items():
        picks = []
        for M in DECODE_ROWS:
            at = {engine: m for (p, l, m_rows, engine), m in metrics.items() if (p, l, m_rows) == (preset, linear, M)}
            name = min((n for n in CANDIDATES if n in at), key=lambda n: at[n]["us"])
            now, best = at["int8 triton"]["us"], at[name]["us"]
            print(f"| {preset} | {linear} | {N} | {K} | {M} | {now:.2f} | {name} | {best:.2f} | {now / best:.3f} | "
                  f"{100 * at[name]['copy_frac']:.0f} | {at['bf16#2']['us'] / at['bf16']['us']:.3f} |")
            wins = best < (1 - PICK_MARGIN) * now
            config = CANDIDATES[name] if wins else gemm_config(M, N, K)
            if picks and picks[-1][1] == config:              # one bound for a run of Ms with one config
                wins = picks.pop()[2] or wins
            picks.append((M, config, wins))
        if any(won for *_, won in picks):
            entries[(N, K)] = tuple((M, config) for M, config, _ in picks)
    print(f"\n[gemm] DECODE_TABLE entries (triton_int8.py) where a candidate beat the current choice by more "
          f"than {100 * PICK_MARGIN:.0f}%:" + ("" if entries else " none"))
    for shape, entry in entries.items():
        print(f"    {shape}: {entry},")


def retire_earlier_checks(path: Path, run_id: str) -> None:
    """The file's gemm-check records of earlier runs go to history whole: a check's settings follow
    its day's candidates, and a check the new run no longer makes must not stand beside its own."""
    old = read_list(path)
    earlier = [r for r in old if r.get("workload") == "gemm-check" and r.get("run_id") != run_id]
    if earlier:
        history_path(path).parent.mkdir(exist_ok=True)
        write_json(history_path(path), read_list(history_path(path)) + earlier)
        write_json(path, [r for r in old if r.get("workload") != "gemm-check" or r.get("run_id") == run_id])


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
    retire_earlier_checks(out, run["run_id"])
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
    decode_picks(records)
    print(f"[gemm] run {run['run_id']}: wrote {len(records)} records to {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
