"""The small building blocks of a Llama block: RMSNorm, rotary embedding, SwiGLU MLP."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common.model_config import ModelConfig, rope_inv_freq


class RMSNorm(nn.Module):
    fused = True        # on a GPU, the Triton kernel below (False: torch's ops, the ablation)

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the block output x (T, dim) to the residual stream (T, dim), normalize the sum:
        -> (RMSNorm(x + residual), x + residual), the sum in x's dtype. No stream yet (the first
        layer, x the embedding): x starts it, -> (RMSNorm(x), x).
        On a GPU one Triton kernel does both (fused_elementwise.py), the stream updated in place."""
        if x.is_cuda and self.fused:
            from .fused_elementwise import add_rms_norm      # triton: imported where it runs
            return add_rms_norm(x, residual, self.weight, self.eps), x if residual is None else residual
        stream = x if residual is None else x + residual
        # One kernel: it reads the stream in its dtype, normalizes in fp32 inside and applies the
        # weight before rounding back. (Spelled out with fp32 casts around it: four kernels in bf16.)
        return F.rms_norm(stream, (stream.shape[-1],), self.weight, self.eps), stream


class RotaryEmbedding(nn.Module):
    """Rotates q and k by position-dependent angles (the half-split "rotate_half" layout).

    cos/sin for every position are tabulated once; a forward step gathers its rows once
    (`cos_sin`) and every layer reuses them.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        positions = torch.arange(cfg.max_position, dtype=torch.float32)
        freqs = positions[:, None] * rope_inv_freq(cfg)[None, :]    # (max_pos, head_dim/2)
        angles = torch.cat([freqs, freqs], dim=-1)                  # (max_pos, head_dim)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(T,) positions -> cos, sin of shape (T, 1, head_dim), fp32."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (T, heads, head_dim) -> rotated x, computed in fp32, returned in x's dtype."""
    x32 = x.float()
    half = x32.shape[-1] // 2
    rotated = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up fused into one matmul."""
    fused = True        # on a GPU, SiLU * up in one Triton kernel

    def __init__(self, cfg: ModelConfig, tp=None):
        """cfg: this rank's share of the model (its intermediate slice); tp: process groups or None."""
        super().__init__()
        self.tp = tp
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)                       # (T, 2 * intermediate)
        if gate_up.is_cuda and self.fused:
            from .fused_elementwise import silu_and_mul      # one kernel for the two below
            out = self.down_proj(silu_and_mul(gate_up))
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            out = self.down_proj(F.silu(gate) * up)
        return out if self.tp is None else self.tp.all_reduce(out)   # this rank's slice's share
