"""The two Triton kernels of an 8-bit linear on a GPU: the per-token quantizer that feeds it, and the
8-bit GEMM (int8 x int8 -> int32, or e4m3 x e4m3 -> fp32) whose epilogue applies both scales and
writes bf16.

  quantize_rows, one program per row of x (M, K), bf16 in:
    scale[m] = max_k |x[m, k]| / 127                (fp32; a zero row gets a tiny scale, not 0/0)
    q[m, k]  = clamp(round_half_even(x[m, k] / scale[m]), -127, 127)      int8
  (fp8: scale = amax / 448 and q = x / scale cast to e4m3: the same kernel, another store type)
  The RMSNorm before q/k/v and before gate/up, and SiLU * up before down, do this themselves on
  the row they just computed (fused_elementwise: one kernel fewer each, no bf16 row written and
  read back); only o's input, attention's output, goes through the quantizer on its own.

  w8a8_gemm, one program per (BLOCK_M, BLOCK_N) tile of out (M, N):
    acc = sum_k q[m, k] * w[n, k]                   int8: int32, exact (|acc| < 127^2 K < 2^31 for
                                                    K < 133k); e4m3: fp32, as the tensor cores sum it
    out = acc * x_scale[m] * w_scale[n] (+ bias)    in fp32, rounded once to out's dtype

The weight stays in the Linear's (N, K) layout, row n contiguous along K: each tile reads BLOCK_N
rows of it, BLOCK_K bytes at a time. At decode (M = 1..16) the GEMM is a matrix-vector product:
it must read the weight at the memory's bandwidth and nothing else matters, so the tile is short
in N (more programs than SMs) and long in K (few loop trips); M is padded to 16 inside the tile,
the tensor cores' smallest. Above that a square tile reuses each loaded weight byte over M rows.
Every choice depends on shapes only (M is a graph bucket's padded batch), so a captured graph
replays the kernel it captured. Under TRITON_INTERPRET=1 (CPU) both run in numpy: exact integers.
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
def store_quantized(x, q_ptrs, scale_ptr, mask, QMAX: tl.constexpr, IS_INT: tl.constexpr):
    """One row x (BLOCK,) fp32, zeros past the mask -> its 8-bit values at q_ptrs, its scale at
    scale_ptr. Called by the quantizer below and by the norm that quantizes its own output
    (fused_elementwise.add_rms_norm)."""
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-8) / QMAX
    y = x / scale
    if IS_INT:
        y = tl.minimum(tl.maximum(_round_half_even(y), -QMAX), QMAX)
    else:
        y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
    tl.store(q_ptrs, y.to(q_ptrs.dtype.element_ty), mask=mask)
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
def _w8a8_gemm_kernel(a_ptr, w_ptr, a_scale_ptr, w_scale_ptr, bias_ptr, out_ptr, M, N, K,
                      stride_a, stride_w, stride_out, HAS_BIAS: tl.constexpr, ACC: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(1), tl.program_id(0)     # n fastest: neighbours share a's rows
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)         # (BLOCK_M,)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)         # (BLOCK_N,) output channels
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_a + ks[None, :]          # (BLOCK_M, BLOCK_K)
    w_ptrs = w_ptr + cols[None, :] * stride_w + ks[:, None]          # (BLOCK_K, BLOCK_N): w^T's tile
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)           # int32 for int8, fp32 for e4m3
    for k in range(0, K, BLOCK_K):
        k_ok = (k + ks) < K
        a = tl.load(a_ptrs, mask=(rows[:, None] < M) & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=(cols[None, :] < N) & k_ok[:, None], other=0.0)
        acc += tl.dot(a, w, out_dtype=ACC)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    # the epilogue: both scales (and a bias) in fp32 registers, one rounding to the output dtype
    a_scale = tl.load(a_scale_ptr + rows, mask=rows < M, other=0.0)
    w_scale = tl.load(w_scale_ptr + cols, mask=cols < N, other=0.0)
    out = acc.to(tl.float32) * a_scale[:, None] * w_scale[None, :]
    if HAS_BIAS:
        out += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


def gemm_config(M: int, N: int, K: int) -> dict:
    """Tile and launch shape by the (padded) row count: a rule of shapes, never of data. At M <= 16
    it follows the gemm bench's tile sweep on an H100 (llama-1b's and llama-8b's Linears, the
    "triton BN=.." records): BLOCK_K = 512 (few loop trips, many bytes in flight) with BLOCK_N = 32,
    or 16 where K is long against N (down, K = 3.5-4 N: twice the programs share its long rows)."""
    if M <= 16:
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
    -> (M, N) out_dtype."""
    M, K = a.shape
    N = w.shape[0]
    assert a.stride(-1) == 1 and w.stride(-1) == 1 and w.shape[1] == K and w.dtype == a.dtype
    cfg = dict(config or gemm_config(M, N, K))
    out = torch.empty(M, N, dtype=out_dtype, device=a.device)
    grid = (triton.cdiv(N, cfg["BLOCK_N"]), triton.cdiv(M, cfg["BLOCK_M"]))
    _w8a8_gemm_kernel[grid](a, w, a_scale, w_scale, w_scale if bias is None else bias, out, M, N, K,
                            a.stride(0), w.stride(0), out.stride(0), HAS_BIAS=bias is not None,
                            ACC=tl.int32 if a.dtype == torch.int8 else tl.float32, **cfg)
    return out
