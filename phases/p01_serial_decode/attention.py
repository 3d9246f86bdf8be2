"""Grouped-query self-attention over the request's KV cache."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from common.model_config import ModelConfig

from .kv_cache import KVCache
from .layers import apply_rotary


@dataclass
class StepContext:
    """What every layer needs to know about this forward step; built once per step."""
    start: int             # position of the first new token (0 for prefill)
    cos: torch.Tensor      # (T, 1, head_dim) fp32 rotary factors of the new tokens
    sin: torch.Tensor
    cache: KVCache


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        # q, k and v come from one matmul: (T, hidden) -> (T, q_size + 2 * kv_size)
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, step: StepContext) -> torch.Tensor:
        T, H, KV = x.shape[0], self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(T, H + 2 * KV, self.head_dim)
        qk = apply_rotary(qkv[:, :H + KV], step.cos, step.sin)   # q and k rotate together
        q, k, v = qk[:, :H], qk[:, H:], qkv[:, H + KV:]
        k_all, v_all = step.cache.store(self.layer, step.start, k, v)   # (start+T, KV, head_dim)
        out = self._attend(q, k_all, v_all, causal=T > 1)
        return self.o_proj(out.reshape(T, H * self.head_dim))

    def _attend(self, q, k, v, causal: bool) -> torch.Tensor:
        # (T, heads, head_dim) -> (1, heads, T, head_dim) for SDPA: its fused kernels take 4-D
        # inputs only (3-D ones fall back to the math kernel, which writes out every score and,
        # with enable_gqa, copies K/V per query head). GQA: query head h reads kv head
        # h // (H / KV), the repeat_interleave layout; enable_gqa does it without copying K/V.
        # Prefill starts at position 0 here, so T == S and the causal mask is the plain lower
        # triangle; a decode step (T == 1) attends to everything.
        out = F.scaled_dot_product_attention(*(x.transpose(0, 1)[None] for x in (q, k, v)),
                                             is_causal=causal, enable_gqa=True)
        return out[0].transpose(0, 1)                          # (T, heads, head_dim)
