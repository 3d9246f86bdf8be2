"""The small building blocks of a Llama block: RMSNorm, rotary embedding, SwiGLU MLP."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common.model_config import ModelConfig, rope_inv_freq


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in fp32 (bf16 squares overflow precision), scale in the model dtype.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotates q and k by position-dependent angles (the half-split "rotate_half" layout)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        positions = torch.arange(cfg.max_position, dtype=torch.float32)
        freqs = positions[:, None] * rope_inv_freq(cfg)[None, :]    # (max_pos, head_dim/2)
        angles = torch.cat([freqs, freqs], dim=-1)                  # (max_pos, head_dim)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        # q: (T, num_heads, head_dim), k: (T, num_kv_heads, head_dim); math in fp32.
        cos = self.cos[positions][:, None, :]   # (T, 1, head_dim)
        sin = self.sin[positions][:, None, :]
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    half = x32.shape[-1] // 2
    rotated = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
