"""W8A8: the Linear's weight stored in 8 bits with one scale per output channel (offline,
symmetric), its input quantized per token on the fly (dynamic), the product accumulated exactly
in int32 (int8) or fp32 (fp8) and both scales applied in the GEMM's epilogue:

    W (N, K) ~ Wq * sw[:, None]      Wq int8 in [-127, 127] (or e4m3 in [-448, 448]), sw (N,) fp32
    x (M, K) ~ xq * sx[:, None]      xq int8 per row, sx (M,) fp32, from each row's own max |x|
    y = x W^T ~ (xq Wq^T) * sx[:, None] * sw[None, :]

Per token and per channel, because an outlier then costs resolution only to its own row or
column. A weight read is half of bf16's bytes: at decode, where a step reads every weight once and
does little else, that is the speed. On a GPU the quantizer that makes xq is paid on every call:
what INT8 must earn back at every M. Before q/k/v, gate/up and down the kernel that makes x does
it on its rows (QuantizingRMSNorm, QuantizingMLP); o's input, attention's output, comes in float
and a quantizer kernel of its own runs first (triton_int8.py). Where gemm_config picks the GEMV
(decode) the GEMV can quantize it itself instead (QUANTIZING_GEMV: off until timed).

Which GEMM, by rows (M: a step's tokens, or a graph bucket's padded batch, a shape never a value),
from the gemm bench on an H100, weights read cold (gemm-h100.json, git 98c52fd: a layer's four
Linears summed, llama-1b and llama-8b, against bf16):
  int8  the Triton kernel at every M on a GPU. torch._int_mm (cuBLASLt) refuses M <= 16, and above
        that its int32 output and torch's epilogue passes over it ran 0.36-1.09x of bf16 at
        M = 32 ... 4096, where the Triton kernel (scales applied in registers) ran 0.80-1.42x.
        On a CPU torch._int_mm.
  fp8   the same Triton kernel on e4m3 at M <= TRITON_MAX_M: torch._scaled_mm ran 0.97-1.25x of
        bf16 there, the Triton kernel on e4m3 1.37-1.76x (at decode only a kernel that streams the
        weight pays); torch._scaled_mm above it (1.00-1.83x of bf16: Hopper's e4m3 tensor cores)
        and on a CPU.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from .layers import MLP, RMSNorm

MODES = ("w8a8", "w8a8-nosmooth", "fp8")   # the quantization= choices (None: the float model)
INT8_MAX = 127.0
FP8_MAX = 448.0                            # e4m3's largest finite value
TRITON_MAX_M = 16                          # fp8 on a GPU: Triton at or below, _scaled_mm above
# o's float input at decode quantized inside its GEMV (triton_int8.w8a8_gemv_quantizing: one launch
# fewer a layer, the row read from L2 by every program) instead of by quantize_rows first. Bit for
# bit the same output (tested in the interpreter); off until the gemm part's "gemv quantizing"
# against "quantize then gemv" rows have timed it on a GPU.
QUANTIZING_GEMV = False


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row: x (R, K) float -> (q (R, K) int8, scale (R, 1) fp32), x ~ q * scale.
    Weights (rows = output channels) and activations (rows = tokens) alike."""
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / INT8_MAX
    return (x / scale).round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 per row: x (R, K) -> (q (R, K) float8_e4m3fn, scale (R, 1) fp32); rounding by the cast."""
    check_fp8()
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / FP8_MAX
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(R, K) int8 or fp8, (R, 1) -> fp32."""
    return q.float() * scale


def check_fp8(device: str | None = None) -> None:
    """Refuse fp8 where it cannot run: a torch without the e4m3 dtype, or a GPU below SM 8.9."""
    if not hasattr(torch, "float8_e4m3fn"):
        raise ValueError(f"quantization='fp8' needs a torch with float8_e4m3fn (this is {torch.__version__})")
    if device is not None and device.startswith("cuda") and torch.cuda.get_device_capability(device) < (8, 9):
        name = torch.cuda.get_device_name(device)
        raise ValueError(f"quantization='fp8' needs a GPU of SM 8.9 or later (Ada, Hopper); {name} is "
                         f"SM {'.'.join(map(str, torch.cuda.get_device_capability(device)))}: use 'w8a8'")


def limits(fp8: bool) -> tuple[torch.dtype, float]:
    """The 8-bit dtype and its largest value, as the Triton kernels take them."""
    return (torch.float8_e4m3fn, FP8_MAX) if fp8 else (torch.int8, INT8_MAX)


def quantize_tokens(x: torch.Tensor, fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The activation side, per token: one Triton kernel on a GPU, torch's ops elsewhere."""
    if x.is_cuda:
        from .triton_int8 import quantize_rows              # triton: imported where it runs
        return quantize_rows(x.contiguous(), *limits(fp8))
    return quantize_fp8(x) if fp8 else quantize_int8(x)


def int8_matmul(xq: torch.Tensor, sx: torch.Tensor, wq: torch.Tensor, sw: torch.Tensor,
                bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """xq (M, K) int8, sx (M, 1), wq (N, K) int8, sw (N,) -> (M, N) out_dtype."""
    if xq.is_cuda:
        from .triton_int8 import w8a8_gemm                  # triton: imported where it runs
        return w8a8_gemm(xq, sx, wq, sw, bias, out_dtype)
    acc = torch._int_mm(xq, wq.t())                         # (M, N) int32: w^T a column-major view
    return epilogue(acc, sx, sw, bias, out_dtype)


def epilogue(acc: torch.Tensor, sx: torch.Tensor, sw: torch.Tensor, bias: torch.Tensor | None,
             out_dtype: torch.dtype) -> torch.Tensor:
    """int32 (M, N) -> out = acc * sx * sw (+ bias), in fp32, rounded once (torch's ops: a few
    elementwise kernels after cuBLAS's GEMM, where the Triton kernel does it in registers)."""
    out = acc.float() * sx * sw
    return (out if bias is None else out + bias.float()).to(out_dtype)


def fp8_matmul(xq: torch.Tensor, sx: torch.Tensor, wq: torch.Tensor, sw: torch.Tensor,
               bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """xq (M, K) e4m3, sx (M, 1), wq (N, K) e4m3, sw (N,) -> (M, N) out_dtype, chosen by M."""
    if xq.is_cuda and xq.shape[0] <= TRITON_MAX_M:
        from .triton_int8 import w8a8_gemm
        return w8a8_gemm(xq, sx, wq, sw, bias, out_dtype)
    out = torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw.view(1, -1), out_dtype=out_dtype)
    return out if bias is None else out + bias.to(out_dtype)


class Quantized(NamedTuple):
    """Activations already in 8 bits: what a quantizing norm hands the Linear after it."""
    values: torch.Tensor          # (T, K) int8 or e4m3
    scales: torch.Tensor          # (T, 1) fp32
    dtype: torch.dtype            # the model's: the Linear's output dtype

    @property
    def shape(self) -> torch.Size:
        return self.values.shape


class QuantizingRMSNorm(RMSNorm):
    """The RMSNorm before an 8-bit Linear (q/k/v, gate/up) quantizes its output rows per token,
    on a GPU inside its own kernel (fused_elementwise.add_rms_norm): no bf16 row is written and
    read back, and no quantizer launches. -> (Quantized, the residual stream)."""

    def __init__(self, norm: RMSNorm, fp8: bool):
        super().__init__(norm.weight.shape[0], norm.eps)
        self.weight, self.fused, self.fp8 = norm.weight, norm.fused, fp8

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[Quantized, torch.Tensor]:
        if x.is_cuda and self.fused:
            from .fused_elementwise import add_rms_norm      # triton: imported where it runs
            q, scale = add_rms_norm(x, residual, self.weight, self.eps, limits(self.fp8))
            return Quantized(q, scale, x.dtype), x if residual is None else residual
        out, stream = super().forward(x, residual)
        return Quantized(*quantize_tokens(out, self.fp8), out.dtype), stream


class QuantizingMLP(MLP):
    """SwiGLU before an 8-bit down: on a GPU its SiLU * up kernel writes down's rows in 8 bits
    (fused_elementwise.silu_and_mul); elsewhere down quantizes them. The same module, its class
    swapped by quantize_linears (its Linears and its TP group stay)."""
    fp8 = False

    def forward(self, x: torch.Tensor | Quantized) -> torch.Tensor:
        values = x.values if isinstance(x, Quantized) else x
        if not (values.is_cuda and self.fused):
            return super().forward(x)
        from .fused_elementwise import silu_and_mul         # triton: imported where it runs
        gate_up = self.gate_up_proj(x)                       # (T, 2 * intermediate)
        out = self.down_proj(Quantized(*silu_and_mul(gate_up, limits(self.fp8)), gate_up.dtype))
        return out if self.tp is None else self.tp.all_reduce(out)


class QuantLinear(nn.Module):
    """A Linear whose weight is int8 (or e4m3) with per-channel scales: y = x W^T (+ b)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, fp8: bool):
        """weight (N, K) float: quantized per row from its fp32 values."""
        super().__init__()
        self.fp8 = fp8
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        q, scale = quantize_fp8(weight) if fp8 else quantize_int8(weight)
        self.register_buffer("weight", q.contiguous())                 # (N, K): half of bf16's bytes
        self.register_buffer("weight_scale", scale.view(-1).contiguous())   # (N,) fp32
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    def forward(self, x: torch.Tensor | Quantized) -> torch.Tensor:
        """x (M, K) float, or quantized by the norm before -> (M, N) in the model's dtype."""
        if QUANTIZING_GEMV and not isinstance(x, Quantized) and x.is_cuda:
            from .triton_int8 import gemm_config, w8a8_gemv_quantizing     # triton: imported where it runs
            config = gemm_config(x.shape[0], self.out_features, self.in_features)
            if config.get("kernel") == "gemv":      # o at decode: the GEMV quantizes x itself, one launch
                return w8a8_gemv_quantizing(x.contiguous(), self.weight, self.weight_scale, self.bias, x.dtype,
                                            limits(self.fp8)[1], config)
        xq, sx, dtype = x if isinstance(x, Quantized) else (*quantize_tokens(x, self.fp8), x.dtype)
        matmul = fp8_matmul if self.fp8 else int8_matmul
        return matmul(xq, sx, self.weight, self.weight_scale, self.bias, dtype)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, {'fp8 e4m3' if self.fp8 else 'int8'}"


QUANTIZED = (("attn", "qkv_proj"), ("attn", "o_proj"), ("mlp", "gate_up_proj"), ("mlp", "down_proj"))


@torch.no_grad()
def quantize_linears(model: nn.Module, fp8: bool) -> None:
    """Replace every layer's q/k/v, o, gate/up and down Linear by its QuantLinear, in place (the
    embedding and the LM head stay in the model's dtype; so do MLA's latent projections, which its
    absorbed decode reads as matrices: there only o, gate/up and down); the norms before q/k/v and
    gate/up, and SiLU * up before down, quantize their own output. One Linear at a time: its fp32
    copy is the peak memory."""
    for layer in model.layers:
        for block, name in QUANTIZED:
            parent = getattr(layer, block)
            linear = getattr(parent, name, None)
            if linear is None:                      # MLA: no fused q/k/v
                continue
            setattr(parent, name, QuantLinear(linear.weight, linear.bias, fp8))
            del linear                              # the float weight goes now
        if isinstance(getattr(layer.attn, "qkv_proj", None), QuantLinear):
            layer.attn_norm = QuantizingRMSNorm(layer.attn_norm, fp8)
        layer.mlp_norm = QuantizingRMSNorm(layer.mlp_norm, fp8)
        layer.mlp.__class__, layer.mlp.fp8 = QuantizingMLP, fp8
