"""Grouped-query self-attention over the request's KV cache."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common.model_config import ModelConfig

from .kv_cache import KVCache
from .layers import RotaryEmbedding


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, rotary: RotaryEmbedding):
        super().__init__()
        self.layer, self.rotary = layer, rotary
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_size, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_size, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, start: int, cache: KVCache):
        # x: (T, hidden) for T new tokens at positions [start, start+T)
        T = x.shape[0]
        q = self.q_proj(x).view(T, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(T, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(T, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(positions, q, k)
        k_all, v_all = cache.store(self.layer, start, k, v)     # (start+T, kv_heads, head_dim)
        out = self._attend(q, k_all, v_all, causal=T > 1)
        return self.o_proj(out.reshape(T, self.num_heads * self.head_dim))

    def _attend(self, q, k, v, causal: bool) -> torch.Tensor:
        # GQA: each kv head serves num_heads // num_kv_heads query heads (repeat_interleave,
        # so query head h reads kv head h // group).
        group = self.num_heads // self.num_kv_heads
        q = q.transpose(0, 1)                                  # (heads, T, head_dim)
        k = k.transpose(0, 1).repeat_interleave(group, dim=0)  # (heads, S, head_dim)
        v = v.transpose(0, 1).repeat_interleave(group, dim=0)
        # Prefill starts at position 0 here, so T == S and the causal mask is the plain
        # lower triangle; a decode step (T == 1) attends to everything.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return out.transpose(0, 1)                             # (T, heads, head_dim)
