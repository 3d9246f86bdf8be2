"""The Triton kernels of an 8-bit linear on a GPU: the per-token quantizer that feeds it, and the
8-bit GEMM (int8 x int8 -> int32, or e4m3 x e4m3 -> fp32) whose epilogue applies both scales and
writes bf16.

  quantize_rows, one program per row of x (M, K), bf16 in:
    scale[m] = max_k |x[m, k]| / 127                (fp32; a zero row gets a tiny scale, not 0/0)
    q[m, k]  = clamp(round_half_even(x[m, k] / scale[m]), -127, 127)      int8
  (fp8: scale = amax / 448 and q = x / scale cast to e4m3: the same kernel, another store type)
  The RMSNorm before q/k/v and before gate/up, and SiLU * up before down, do this themselves on
  the row they just computed (fused_elementwise: one kernel fewer each, no bf16 row written and
  read back). o's input, attention's output, has no such producer: it goes through the
  quantizer, or, where gemm_config picks the GEMV below (decode: M = 1 at llama-1b's and
  llama-8b's o), the GEMV can quantize it itself (w8a8_gemv_quantizing; quant.QUANTIZING_GEMV,
  off until timed on a GPU).

  w8a8_gemm, one program per (BLOCK_M, BLOCK_N) tile of out (M, N) (and slice of K, below):
    acc = sum_k q[m, k] * w[n, k]                   int8: int32, exact (|acc| < 127^2 K < 2^31 for
                                                    K < 133k); e4m3: fp32, rounded as it is summed
    out = acc * x_scale[m] * w_scale[n] (+ bias)    in fp32, rounded once to out's dtype

The weight stays in the Linear's (N, K) layout, row n contiguous along K: each tile reads BLOCK_N
rows of it, BLOCK_K bytes at a time. At decode (M = 1..16) the GEMM is a matrix-vector product:
it must read the weight at the memory's bandwidth and nothing else matters, so the tile is short
in N (more programs than SMs) and long in K (few loop trips); M is padded to 16 inside the tile,
the tensor cores' smallest. Above that a square tile reuses each loaded weight byte over M rows.
Two more shapes of the decode GEMM, for the sweep to weigh against the tile (gemm_config picks
by shape, from the sweep's table):
  split-K   the K loop cut into SPLIT_K slices, one program per (tile, slice): more programs for a
            long K against a short N (down: N = 4096 is 256 tiles of 16 for 132 SMs). Each writes
            its raw sums (SPLIT_K, M, N); a second small kernel adds them (int32: exactly) and
            applies the epilogue, so the scales still multiply the whole sum, once.
  GEMV      M <= 4 on the CUDA cores, no tl.dot: a (BLOCK_N, BLOCK_K) tile of w times a's rows,
            multiplied in int32 and summed along K. No padding to 16 rows and BLOCK_N down to 4:
            more, smaller programs. It takes SPLIT_K too. Given float rows it quantizes them
            itself: each program finds the rows' scales (max |x| over all of K), then puts each
            chunk on the 8-bit grid in registers, the quantizer's math (one launch fewer).
Every choice depends on shapes only (M is a graph bucket's padded batch), so a captured graph
replays the kernels it captured. Under TRITON_INTERPRET=1 (CPU) all run in numpy: exact integers.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _round_half_even(y):
    """torch.round's rounding (ties to even), from floor: exact for |y| < 2^23."""
    r = tl.floor(y)
    frac = y - r
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where((frac > 0.5) | ((frac == 0.5) & odd), r + 1.0, r)


@triton.jit
def _row_scale(amax, QMAX: tl.constexpr):
    """A row's largest |x| (fp32) -> its scale; a zero row gets a tiny one, not 0/0."""
    return tl.maximum(amax, 1e-8) / QMAX


@triton.jit
def _on_grid(x, scale, QMAX: tl.constexpr, IS_INT: tl.constexpr):
    """x / scale on the 8-bit grid, still fp32: int8's integers (ties to even) in [-127, 127], or
    e4m3's range (its rounding is the cast to e4m3 after)."""
    y = x / scale
    if IS_INT:
        y = _round_half_even(y)
    return tl.minimum(tl.maximum(y, -QMAX), QMAX)


@triton.jit
def store_quantized(x, q_ptrs, scale_ptr, mask, QMAX: tl.constexpr, IS_INT: tl.constexpr):
    """One row x (BLOCK,) fp32, zeros past the mask -> its 8-bit values at q_ptrs, its scale at
    scale_ptr. Called by the quantizer below and by the norm that quantizes its own output
    (fused_elementwise.add_rms_norm); the quantizing GEMV does the same math a chunk at a time."""
    scale = _row_scale(tl.max(tl.abs(x), axis=0), QMAX)
    tl.store(q_ptrs, _on_grid(x, scale, QMAX, IS_INT).to(q_ptrs.dtype.element_ty), mask=mask)
    tl.store(scale_ptr, scale)


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, stride_x, stride_q, K, QMAX: tl.constexpr,
                          IS_INT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < K
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    store_quantized(x, q_ptr + row * stride_q + cols, scale_ptr + row, mask, QMAX, IS_INT)


def quantize_rows(x: torch.Tensor, dtype: torch.dtype, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> (q (M, K) of `dtype`, scale (M, 1) fp32): one program per token, one read of x."""
    M, K = x.shape
    assert x.stride(-1) == 1
    q = torch.empty(M, K, dtype=dtype, device=x.device)
    scale = torch.empty(M, 1, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(K)
    _quantize_rows_kernel[(M,)](x, q, scale, x.stride(0), q.stride(0), K, QMAX=qmax, IS_INT=dtype == torch.int8,
                                BLOCK=block, num_warps=min(16, max(1, block // 512)))
    return q, scale


@triton.jit
def _epilogue(acc, a_scale, rows, cols, M, N, w_scale_ptr, bias_ptr, out_ptr, stride_out,
              HAS_BIAS: tl.constexpr):
    """acc (R, C): the full sums over K, a_scale (R,) fp32 -> both scales (and a bias) in fp32
    registers, one rounding to out's dtype."""
    w_scale = tl.load(w_scale_ptr + cols, mask=cols < N, other=0.0)
    out = acc.to(tl.float32) * a_scale[:, None] * w_scale[None, :]
    if HAS_BIAS:
        out += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _finish(acc, a_scale, rows, cols, M, N, w_scale_ptr, bias_ptr, out_ptr, partial_ptr, stride_out,
            HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr):
    """A program's sums over its slice of K. One slice: they are the whole sums, the epilogue runs
    here (a_scale (R,): the rows' scales). Several: raw into partial[split] (SPLIT_K, M, N), for
    _split_k_sum_kernel to add up (a_scale unused)."""
    if SPLIT_K == 1:
        _epilogue(acc, a_scale, rows, cols, M, N, w_scale_ptr, bias_ptr, out_ptr, stride_out, HAS_BIAS)
    else:
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        tl.store(partial_ptr + (tl.program_id(2) * M + rows[:, None]) * N + cols[None, :], acc, mask=mask)


@triton.jit
def _w8a8_gemm_kernel(a_ptr, w_ptr, a_scale_ptr, w_scale_ptr, bias_ptr, out_ptr, partial_ptr, M, N, K,
                      k_per_split, stride_a, stride_w, stride_out, HAS_BIAS: tl.constexpr, ACC: tl.constexpr,
                      SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The tensor cores' tile: one program per (BLOCK_M, BLOCK_N) tile of out and slice of K."""
    pid_m, pid_n = tl.program_id(1), tl.program_id(0)     # n fastest: neighbours share a's rows
    k_start = tl.program_id(2) * k_per_split               # this program's slice [k_start, k_end) of K
    k_end = tl.minimum(k_start + k_per_split, K)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)         # (BLOCK_M,)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)         # (BLOCK_N,) output channels
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_a + k_start + ks[None, :]          # (BLOCK_M, BLOCK_K)
    w_ptrs = w_ptr + cols[None, :] * stride_w + k_start + ks[:, None]          # (BLOCK_K, BLOCK_N): w^T's tile
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)           # int32 for int8, fp32 for e4m3
    for k in range(k_start, k_end, BLOCK_K):
        k_ok = (k + ks) < k_end
        a = tl.load(a_ptrs, mask=(rows[:, None] < M) & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=(cols[None, :] < N) & k_ok[:, None], other=0.0)
        acc += tl.dot(a, w, out_dtype=ACC)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    a_scale = tl.load(a_scale_ptr + rows, mask=rows < M, other=0.0)
    _finish(acc, a_scale, rows, cols, M, N, w_scale_ptr, bias_ptr, out_ptr, partial_ptr, stride_out,
            HAS_BIAS, SPLIT_K)


@triton.jit
def _scales_of_rows(x_ptr, rows, M, K, stride_x, QMAX: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """The scales (BLOCK_M,) fp32 of float rows x (M, K): each row's largest |x| over all of K, a
    (BLOCK_M, BLOCK_K) chunk at a time (a max is exact in any order: quantize_rows's value)."""
    ks = tl.arange(0, BLOCK_K)
    amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        mask = (rows[:, None] < M) & ((k + ks) < K)[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x + k + ks[None, :], mask=mask, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
    return _row_scale(amax, QMAX)


@triton.jit
def _w8a8_gemv_kernel(a_ptr, w_ptr, a_scale_ptr, w_scale_ptr, bias_ptr, out_ptr, partial_ptr, M, N, K,
                      k_per_split, stride_a, stride_w, stride_out, HAS_BIAS: tl.constexpr, ACC: tl.constexpr,
                      SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      QUANT: tl.constexpr, QMAX: tl.constexpr):
    """The CUDA cores' GEMV: no tl.dot, so no 16-row padding and no 16-wide minimum in N. One
    program per BLOCK_N output channels and slice of K, over all of a's M <= BLOCK_M rows.
    QUANT 0: a is 8-bit, its scales at a_scale_ptr. QUANT 1 (int8) or 2 (e4m3): a is the float
    rows, quantized here as quantize_rows would (w8a8_gemv_quantizing); with SPLIT_K > 1 their
    scales go to a_scale_ptr for the sum kernel."""
    k_start = tl.program_id(2) * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    rows = tl.arange(0, BLOCK_M)                           # (BLOCK_M,): every row of a
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    if QUANT:                                              # a first pass over all of K: the rows' max
        a_scale = _scales_of_rows(a_ptr, rows, M, K, stride_a, QMAX, BLOCK_M, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_a + k_start + ks[None, :]          # (BLOCK_M, BLOCK_K)
    w_ptrs = w_ptr + cols[:, None] * stride_w + k_start + ks[None, :]          # (BLOCK_N, BLOCK_K): w's rows
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    for k in range(k_start, k_end, BLOCK_K):
        k_ok = (k + ks) < k_end
        a = tl.load(a_ptrs, mask=(rows[:, None] < M) & k_ok[None, :], other=0.0)
        if QUANT:           # the chunk in 8 bits, in registers: the values quantize_rows would store
            a = _on_grid(a.to(tl.float32), a_scale[:, None], QMAX, QUANT == 1).to(w_ptr.dtype.element_ty)
        a = a.to(ACC)
        w = tl.load(w_ptrs, mask=(cols[:, None] < N) & k_ok[None, :], other=0.0).to(ACC)
        # products summed along K (int8: in int32, exact) into (BLOCK_M, BLOCK_N)
        if BLOCK_M == 1:        # batch 1: (1, BLOCK_K) x (BLOCK_N, BLOCK_K), no 3-D layout to map
            acc += tl.sum(a * w, axis=1)[None, :]
        else:                   # (BLOCK_M, 1, BLOCK_K) x (1, BLOCK_N, BLOCK_K)
            acc += tl.sum(a[:, None, :] * w[None, :, :], axis=2)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if QUANT == 0:
        a_scale = tl.load(a_scale_ptr + rows, mask=rows < M, other=0.0)
    elif SPLIT_K > 1:       # every program has the same scales: the first one writes them
        if tl.program_id(0) + tl.program_id(2) == 0:
            tl.store(a_scale_ptr + rows, a_scale, mask=rows < M)
    _finish(acc, a_scale, rows, cols, M, N, w_scale_ptr, bias_ptr, out_ptr, partial_ptr, stride_out,
            HAS_BIAS, SPLIT_K)


@triton.jit
def _split_k_sum_kernel(partial_ptr, a_scale_ptr, w_scale_ptr, bias_ptr, out_ptr, M, N, stride_out,
                        HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr):
    """partial (SPLIT_K, M, N) -> out: the slices' sums added (int32: exactly, in any order), then
    the same epilogue as one slice's. One program per (BLOCK_M, BLOCK_N) tile of out."""
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    ptrs = partial_ptr + rows[:, None] * N + cols[None, :]
    acc = tl.load(ptrs, mask=mask, other=0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(ptrs + s * M * N, mask=mask, other=0)
    a_scale = tl.load(a_scale_ptr + rows, mask=rows < M, other=0.0)
    _epilogue(acc, a_scale, rows, cols, M, N, w_scale_ptr, bias_ptr, out_ptr, stride_out, HAS_BIAS)


GEMV_MAX_M = 4          # the CUDA-core kernel holds every row of a in one program: 4 at the most
SUM_BLOCK_N = 128       # _split_k_sum_kernel's tile width (its tile is (<= 16 rows, 128 columns))

# Decode configs by Linear shape, from the gemm bench's sweep on an H100 with cold weights
# (`make phase-19 bench PART=gemm`, gemm-h100.json; kernel_bench.py prints the entries to paste,
# "DECODE_TABLE entries"; only where a candidate beat the rule by more than 2%, the bf16 A/A there
# being within 0.6%): (N, K) -> ((up to M rows, config), ...), bounds rising; the first bound at or
# above M wins, and a shape not listed (or an M past its last bound) takes the rule in gemm_config.
# The sweep times int8; e4m3 takes the same entries (the same bytes to stream). At M = 1 the
# CUDA-core GEMV wins every Linear of llama-1b and llama-8b but llama-1b's down (split-K there).
DECODE_TABLE: dict[tuple[int, int], tuple[tuple[int, dict], ...]] = {
    (3072, 2048): ((1, dict(kernel="gemv", BLOCK_N=4, BLOCK_K=1024, SPLIT_K=1, num_warps=4, num_stages=1)),
                   (16, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=512, num_warps=4, num_stages=3))),
    (2048, 2048): ((1, dict(kernel="gemv", BLOCK_N=4, BLOCK_K=1024, SPLIT_K=1, num_warps=4, num_stages=1)),
                   (4, dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=512, num_warps=4, num_stages=4)),
                   (16, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=512, num_warps=4, num_stages=3))),
    (16384, 2048): ((1, dict(kernel="gemv", BLOCK_N=16, BLOCK_K=512, SPLIT_K=1, num_warps=4, num_stages=1)),
                    (16, dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4))),
    (2048, 8192): ((1, dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, SPLIT_K=8, num_warps=4, num_stages=4)),
                   (4, dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, SPLIT_K=4, num_warps=4, num_stages=4)),
                   (16, dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=512, num_warps=4, num_stages=4))),
    (6144, 4096): ((1, dict(kernel="gemv", BLOCK_N=8, BLOCK_K=1024, SPLIT_K=1, num_warps=4, num_stages=1)),
                   (16, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=512, num_warps=4, num_stages=3))),
    (4096, 4096): ((1, dict(kernel="gemv", BLOCK_N=4, BLOCK_K=1024, SPLIT_K=1, num_warps=4, num_stages=1)),
                   (4, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=1024, num_warps=4, num_stages=3)),
                   (16, dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=512, num_warps=4, num_stages=4))),
    (28672, 4096): ((1, dict(kernel="gemv", BLOCK_N=8, BLOCK_K=1024, SPLIT_K=1, num_warps=4, num_stages=1)),
                    (16, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=512, num_warps=4, num_stages=3))),
    (4096, 14336): ((1, dict(kernel="gemv", BLOCK_N=4, BLOCK_K=1024, SPLIT_K=1, num_warps=4, num_stages=1)),
                    (4, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=1024, num_warps=4, num_stages=3)),
                    (16, dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=512, num_warps=4, num_stages=4))),
}


def gemm_config(M: int, N: int, K: int) -> dict:
    """Kernel, tile and launch shape by the (padded) row count and the weight's shape: a rule of
    shapes, never of data. At M <= 16 DECODE_TABLE's entry for (N, K) if it has one; else the rule
    from the gemm bench's tile sweep on an H100 (llama-1b's and llama-8b's Linears, the
    "triton BN=.." records): BLOCK_K = 512 (few loop trips, many bytes in flight) with BLOCK_N = 32,
    or 16 where K is long against N (down, K = 3.5-4 N: twice the programs share its long rows).
    A config: the kernel ("dot", the default, or "gemv"), SPLIT_K (default 1), the tile, the launch."""
    if M <= 16:
        for max_m, config in DECODE_TABLE.get((N, K), ()):
            if M <= max_m:
                return dict(config)
        long_k = K >= 3 * N
        return dict(BLOCK_M=16, BLOCK_N=16 if long_k else 32, BLOCK_K=512, num_warps=4,
                    num_stages=4 if long_k else 3)
    if M <= 64:
        return dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4)
    if M <= 256:
        return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, num_warps=4, num_stages=4)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, num_warps=8, num_stages=3)


def w8a8_gemm(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
              bias: torch.Tensor | None, out_dtype: torch.dtype, config: dict | None = None) -> torch.Tensor:
    """a (M, K) int8 or e4m3, a_scale (M, 1) fp32, w (N, K) of a's dtype, w_scale (N,) fp32
    -> (M, N) out_dtype. With SPLIT_K > 1 a second kernel adds the slices' sums: two launches, no
    host read and no atomics, so a CUDA graph captures it as it captures one."""
    assert w.dtype == a.dtype
    return _launch(a, a_scale, w, w_scale, bias, out_dtype, config)


def w8a8_gemv_quantizing(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                         out_dtype: torch.dtype, qmax: float, config: dict | None = None) -> torch.Tensor:
    """x (M <= 4, K) bf16 or fp32 rows not yet quantized, w (N, K) int8 or e4m3 (qmax: its largest
    value), w_scale (N,) fp32 -> (M, N) out_dtype: quantize_rows then the GEMV, bit for bit, in one
    launch. Each program finds the rows' scales itself (a first pass over x for max |x|: every
    program the same ops, the same values), then puts each BLOCK_K chunk on the 8-bit grid in
    registers as it streams its BLOCK_N rows of w. Why: at decode o's input (attention's output)
    has no producer that quantizes it, and a quantizer of its own is one launch more per layer
    (~2 us each at batch 1). The price: every program reads the rows from L2 (2 x 2K bytes a bf16
    row, two passes) beside its BLOCK_N x K weight bytes from memory. config: a "gemv" one
    (gemm_config's for the shape by default)."""
    M, K = x.shape
    cfg = dict(config or gemm_config(M, w.shape[0], K))
    assert cfg.get("kernel") == "gemv" and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
    split = cfg.get("SPLIT_K", 1)       # the sum kernel's epilogue reads the scales the GEMV writes
    x_scale = w_scale if split == 1 else torch.empty(M, 1, dtype=torch.float32, device=x.device)
    return _launch(x, x_scale, w, w_scale, bias, out_dtype, cfg, qmax)


def _launch(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
            bias: torch.Tensor | None, out_dtype: torch.dtype, config: dict | None,
            qmax: float | None = None) -> torch.Tensor:
    """Both entries above: a (M, K) in 8 bits with its scales, or (qmax given) float rows for the
    GEMV to quantize, a_scale then where it writes their scales for a split-K sum."""
    M, K = a.shape
    N = w.shape[0]
    assert a.stride(-1) == 1 and w.stride(-1) == 1 and w.shape[1] == K
    cfg = dict(config or gemm_config(M, N, K))
    kernel, split = cfg.pop("kernel", "dot"), cfg.pop("SPLIT_K", 1)
    if kernel == "gemv":
        assert M <= GEMV_MAX_M, f"the GEMV kernel takes up to {GEMV_MAX_M} rows, not {M}"
        cfg |= dict(BLOCK_M=triton.next_power_of_2(M), QMAX=qmax or 1.0,
                    QUANT=0 if qmax is None else (1 if w.dtype == torch.int8 else 2))
    acc = torch.int32 if w.dtype == torch.int8 else torch.float32
    out = torch.empty(M, N, dtype=out_dtype, device=a.device)
    # slice s sums K's [s * k_per_split, (s + 1) * k_per_split): whole BLOCK_K steps; the last slice short or empty
    k_per_split = triton.cdiv(triton.cdiv(K, split), cfg["BLOCK_K"]) * cfg["BLOCK_K"]
    partial = out if split == 1 else torch.empty(split, M, N, dtype=acc, device=a.device)
    grid = (triton.cdiv(N, cfg["BLOCK_N"]), triton.cdiv(M, cfg["BLOCK_M"]), split)
    bias_arg = w_scale if bias is None else bias
    launch = _w8a8_gemv_kernel if kernel == "gemv" else _w8a8_gemm_kernel
    launch[grid](a, w, a_scale, w_scale, bias_arg, out, partial, M, N, K, k_per_split, a.stride(0), w.stride(0),
                 out.stride(0), HAS_BIAS=bias is not None, ACC=tl.int32 if acc == torch.int32 else tl.float32,
                 SPLIT_K=split, **cfg)
    if split > 1:
        rows = min(16, triton.next_power_of_2(M))
        _split_k_sum_kernel[(triton.cdiv(N, SUM_BLOCK_N), triton.cdiv(M, rows))](
            partial, a_scale, w_scale, bias_arg, out, M, N, out.stride(0), HAS_BIAS=bias is not None,
            SPLIT_K=split, BLOCK_M=rows, BLOCK_N=SUM_BLOCK_N, num_warps=4)
    return out
