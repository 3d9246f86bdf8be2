"""Grouped-query self-attention over the paged KV pool, for a batch of sequences."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from common.model_config import ModelConfig

from .kv_cache import KVCache
from .layers import apply_rotary

# The SDPA kernels attention may use: all but cuDNN's. cuDNN builds an execution plan for every
# new shape, milliseconds of host time per call on an H200, and a decode step's key length is new
# every step: each layer of each step would pay it. The others need no plan.
BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class StepContext:
    """Per-step attention metadata: built once per step by the model runner, read by every layer.

    A step's new tokens are flat: sequence b's are rows [cu_seqlens[b], cu_seqlens[b+1]) of every
    (T, ...) activation, T = all new tokens of the step (B prompts, or one token per sequence).
    """
    is_prefill: bool
    cos: torch.Tensor           # (T, 1, head_dim) fp32 rotary factors of the new tokens
    sin: torch.Tensor
    slot_mapping: torch.Tensor  # (T,) int64: the pool slot that receives each new token's K/V
    last_rows: torch.Tensor     # (B,) int64: row of each sequence's last new token (the sampled one)
    cache: KVCache
    cu_seqlens: list[int] | None = None      # prefill: (B+1,) host ints, prompt boundaries in T
    kv_index: torch.Tensor | None = None     # decode: (B, max(context_lens)) int64 pool slot of each key
    context_lens: list[int] | None = None    # decode: (B,) host ints, cached tokens incl. this step's
    key_mask: torch.Tensor | None = None     # decode: (B, 1, 1, max(context_lens)) bool, True = a real key


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
        step.cache.store(self.layer, step.slot_mapping, k, v)
        out = self._prefill(q, k, v, step.cu_seqlens) if step.is_prefill else self._decode(q, step)
        return self.o_proj(out.reshape(T, H * self.head_dim))

    def _prefill(self, q, k, v, cu_seqlens: list[int]) -> torch.Tensor:
        # Nothing is cached before a prompt, so each prompt attends to its own fresh k, v: causal
        # attention per prompt (T_b == S_b, the plain lower triangle), no padding, no mask.
        # A varlen kernel (flash-attn's) would do all prompts in one launch; the loop is exact.
        spans = zip(cu_seqlens, cu_seqlens[1:])
        return torch.cat([_causal(q[a:b], k[a:b], v[a:b]) for a, b in spans])

    def _decode(self, q, step: StepContext) -> torch.Tensor:
        # One new token per sequence reads all its cached keys: gather them out of the blocks into
        # (B, S, KV, head_dim), S = the longest context, and mask each row past its own length.
        # GQA: the H / KV query heads that share a KV head act as that head's query rows. (SDPA's
        # enable_gqa with a mask means its math kernel: K/V copied per query head, in fp32.)
        B, KV, G = q.shape[0], self.num_kv_heads, self.num_heads // self.num_kv_heads
        k, v = step.cache.gather(self.layer, step)                      # (B, S, KV, head_dim)
        with sdpa_kernel(BACKENDS):
            out = F.scaled_dot_product_attention(q.view(B, KV, G, self.head_dim), k.transpose(1, 2),
                                                 v.transpose(1, 2), attn_mask=step.key_mask)
        # reshape, not view: the efficient kernel returns (B, KV, G, D) with G strided apart
        return out.reshape(B, self.num_heads, self.head_dim)            # (B, H, head_dim)


def _causal(q, k, v) -> torch.Tensor:
    # (T, heads, head_dim) -> (1, heads, T, head_dim) for SDPA and back: its fused kernels take 4-D
    # inputs only, and 3-D ones fall back to the math kernel, which writes out the (heads, T, T)
    # scores. GQA: query head h reads kv head h // (H / KV), the repeat_interleave layout;
    # enable_gqa does it without copying K/V.
    with sdpa_kernel(BACKENDS):
        out = F.scaled_dot_product_attention(*(x.transpose(0, 1)[None] for x in (q, k, v)),
                                             is_causal=True, enable_gqa=True)
    return out[0].transpose(0, 1)
