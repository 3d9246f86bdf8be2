"""The residual add with the RMSNorm after it, and SiLU with the multiply: one Triton kernel each.

Replayed from a graph, a decode step costs what its kernels take on the GPU, and each kernel at
least a couple of microseconds however little it reads. At batch 1 a Llama layer ran, besides its
GEMMs and attention, two residual adds, two norms, a SiLU and a multiply: six kernels of a few
kilobytes each, ~18 us per llama-8b layer, ~0.55 ms of a 5.4 ms step. Fused neighbours read their
input once and launch once:

  add_rms_norm, one program per row (T rows of `dim`):
    s = round(x + residual)              the residual stream, rounded to the model's dtype as the
                                         unfused add did, written back over `residual`
    out = s * rsqrt(mean(s^2) + eps) * w in fp32, rounded once
  silu_and_mul, one program per (row, block of columns) of gate_up (T, 2I):
    out = round(round(silu(gate)) * up)  rounded twice, as F.silu then the multiply did

So a layer runs one add+norm before attention and one before the MLP (the second one's sum is the
stream the next layer adds to), and the final norm takes the last layer's add. Before an 8-bit
Linear the norm, and SiLU * up before down, also quantize their rows per token
(triton_int8.store_quantized): one kernel each, a program a row. On a CPU the torch
reference runs instead (layers.py), unless TRITON_INTERPRET=1; tests compare the two.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_int8 import store_quantized


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, scale_ptr, stride_x, stride_res, stride_out, dim, eps,
                         BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, QMAX: tl.constexpr, QUANT: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:                                      # the stream: rounded, then stored in place
        res = res_ptr + row * stride_res + cols
        s = (x + tl.load(res, mask=mask, other=0.0).to(tl.float32)).to(res_ptr.dtype.element_ty)
        tl.store(res, s, mask=mask)
        x = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / dim + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * rstd * w
    if QUANT:       # the row rounded to the model's dtype as the unfused norm wrote it, then 8 bits a value
        y = y.to(x_ptr.dtype.element_ty).to(tl.float32)
        store_quantized(y, out_ptr + row * stride_out + cols, scale_ptr + row, mask, QMAX, QUANT == 1)
    else:
        tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                 quantize: tuple[torch.dtype, float] | None = None):
    """x (T, dim) -> RMSNorm(x + residual) (T, dim); residual (T, dim) becomes x + residual in
    place. residual None: RMSNorm(x), nothing else written. quantize (int8 or e4m3, its largest
    value): the normalized rows per token in that dtype instead, -> (values (T, dim), scales (T, 1))."""
    T, dim = x.shape
    assert x.stride(-1) == 1 and (residual is None or (residual.shape == x.shape and residual.stride(-1) == 1))
    out = torch.empty_like(x) if quantize is None else torch.empty(T, dim, dtype=quantize[0], device=x.device)
    scale = out if quantize is None else torch.empty(T, 1, dtype=torch.float32, device=x.device)
    res = x if residual is None else residual             # (never read without HAS_RESIDUAL)
    block = triton.next_power_of_2(dim)
    kind = 0 if quantize is None else (1 if quantize[0] == torch.int8 else 2)
    _add_rms_norm_kernel[(T,)](x, res, weight, out, scale, x.stride(0), res.stride(0), out.stride(0), dim, eps,
                               BLOCK=block, HAS_RESIDUAL=residual is not None, QMAX=quantize[1] if quantize else 1.0,
                               QUANT=kind, num_warps=min(16, max(1, block // 256)))
    return out if quantize is None else (out, scale)


@triton.jit
def _silu_and_mul_kernel(gate_up_ptr, out_ptr, scale_ptr, stride_in, stride_out, inter, BLOCK: tl.constexpr,
                         QMAX: tl.constexpr, QUANT: tl.constexpr):
    row, block = tl.program_id(0), tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_in + inter + cols, mask=mask, other=0.0).to(tl.float32)
    dtype = gate_up_ptr.dtype.element_ty
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    y = (act * up).to(dtype)
    if QUANT:       # one program a row (BLOCK >= inter): the row's max is this program's
        store_quantized(y.to(tl.float32), out_ptr + row * stride_out + cols, scale_ptr + row, mask, QMAX, QUANT == 1)
    else:
        tl.store(out_ptr + row * stride_out + cols, y, mask=mask)


def silu_and_mul(gate_up: torch.Tensor, quantize: tuple[torch.dtype, float] | None = None):
    """gate_up (T, 2I), gate then up -> silu(gate) * up (T, I). quantize (int8 or e4m3, its largest
    value): its rows per token in that dtype instead, -> (values (T, I), scales (T, 1))."""
    T, width = gate_up.shape
    assert gate_up.stride(-1) == 1 and width % 2 == 0
    inter = width // 2
    block = 1024 if quantize is None else triton.next_power_of_2(inter)
    out = torch.empty(T, inter, dtype=gate_up.dtype if quantize is None else quantize[0], device=gate_up.device)
    scale = out if quantize is None else torch.empty(T, 1, dtype=torch.float32, device=gate_up.device)
    kind = 0 if quantize is None else (1 if quantize[0] == torch.int8 else 2)
    _silu_and_mul_kernel[(T, triton.cdiv(inter, block))](gate_up, out, scale, gate_up.stride(0), out.stride(0), inter,
                                                         BLOCK=block, QMAX=quantize[1] if quantize else 1.0, QUANT=kind,
                                                         num_warps=4 if quantize is None else min(16, max(4, block // 512)))
    return out if quantize is None else (out, scale)
