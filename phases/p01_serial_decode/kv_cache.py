"""KVCache: one request's keys and values, preallocated for its whole lifetime."""
from __future__ import annotations

import torch

from common.model_config import ModelConfig


class KVCache:
    """k, v: (num_layers, max_len, num_kv_heads, head_dim), filled left to right.

    Allocated once per request for prompt + max_tokens, so the decode loop never reallocates
    or concatenates (HF's DynamicCache grows by torch.cat every step).
    """

    def __init__(self, cfg: ModelConfig, max_len: int, device: str, dtype: torch.dtype):
        shape = (cfg.num_layers, max_len, cfg.num_kv_heads, cfg.head_dim)
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.max_len = max_len

    def store(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        """Write k, v (T, num_kv_heads, head_dim) at [start, start+T); return the filled prefix
        of this layer, (start+T, num_kv_heads, head_dim) each."""
        end = start + k.shape[0]
        if end > self.max_len:
            raise RuntimeError(f"KV cache overflow: {end} > {self.max_len}")
        self.k[layer, start:end] = k
        self.v[layer, start:end] = v
        return self.k[layer, :end], self.v[layer, :end]
