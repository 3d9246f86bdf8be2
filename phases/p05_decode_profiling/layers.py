"""The small building blocks of a Llama block: RMSNorm, rotary embedding, SwiGLU MLP."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common.model_config import ModelConfig, rope_inv_freq


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, fused: bool = True):
        super().__init__()
        self.eps, self.fused = eps, fused
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            # One kernel: it reads x in its dtype, normalizes in fp32 inside and applies the weight
            # before rounding back. The unfused path below is four kernels in bf16 (cast up, norm,
            # cast down, weight multiply), two norms per layer: the profile counted them among
            # the step's ~560 launches.
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        # x * rsqrt(mean(x^2) + eps), normalized in fp32 (bf16 loses the small terms of the mean
        # square) and scaled in the model dtype. F.rms_norm normalizes in one kernel where the
        # formula spelled out is five (pow, mean, add, rsqrt, mul), but the fp32 round trip
        # around it still costs launches: this forward is four kernels in bf16 (cast up, norm,
        # cast down, weight multiply) and two in fp32 (the casts are no-ops). At batch 1 the
        # host's launch rate sets the speed, so every launch counts.
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


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

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)
