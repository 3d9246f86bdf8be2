"""Grouped-query self-attention over the paged KV pool, for a batch of sequences."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from common.model_config import ModelConfig

from .kv_cache import KVCache
from .layers import apply_rotary


@dataclass
class StepContext:
    """Per-step attention metadata, one description for both kinds of step: built once per step
    by the model runner (from host lists, copied to the device in one transfer), read by every
    layer and by the attention backend.

    Sequence b computes q_b new tokens, at positions [context_lens[b] - q_b, context_lens[b]):
    a prompt's chunk (the whole prompt, or a part of it after the chunks already cached), or a
    decode's one token. They are rows
    [cu_seqlens_q[b], cu_seqlens_q[b+1]) of every (T, ...) activation, T = sum of q_b. Host ints
    (lengths known when the step is planned) size things; device tensors feed kernels: nothing in
    the step reads a device value back to the host.
    """
    is_prefill: bool            # which kernel a backend runs: chunks with a decode's rows mixed in
                                # (some q_b > 1: prefill), or one token each (decode)
    cos: torch.Tensor           # (T, 1, head_dim) fp32 rotary factors of the new tokens
    sin: torch.Tensor
    slot_mapping: torch.Tensor  # (T,) int64: the pool slot that receives each new token's K/V
    last_rows: torch.Tensor     # (R,) int64: rows whose logits the step returns (each sequence's last, a verify's k + 1)
    cache: KVCache
    backend: object             # attention_backends.py: who computes attention this step
    dtype: torch.dtype          # of the pool, q, k and v
    cu_seqlens_q: torch.Tensor          # (B+1,) int32: query boundaries in T
    cu_seqlens_q_host: list[int]        # the same, host ints
    max_query_len: int                  # the largest q_b
    context_lens: torch.Tensor          # (B,) int32: cached tokens per sequence, incl. this step's
    context_lens_host: list[int]        # the same, host ints
    max_context_len: int                # the longest context
    block_tables: torch.Tensor          # (B, max_blocks) int32 block ids, 0-padded
    key_mask: torch.Tensor | None = None  # decode, torch backend only (its prepare() makes it)
    block_index: torch.Tensor | None = None  # decode, torch backend only (block_tables, int64)
    # On a GPU: (rope_store.rope_and_store, positions (T,) int64, cos table, sin table): one kernel
    # rotates q and k and writes k and v to the pool (cos and sin above are then None); on a CPU
    # None: layers.apply_rotary and KVCache.store, the reference, run instead.
    rope: tuple | None = None


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, tp=None):
        """cfg: this rank's share of the model (its heads); tp: the process groups, or None."""
        super().__init__()
        self.layer, self.tp = layer, tp
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        # q, k and v come from one matmul: (T, hidden) -> (T, q_size + 2 * kv_size)
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, step: StepContext) -> torch.Tensor:
        T, H, KV = x.shape[0], self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(T, H + 2 * KV, self.head_dim)
        kv = step.cache.layers[self.layer]               # (2, num_blocks, block_size, KV, head_dim)
        if step.rope is not None:                        # one kernel: rotate q, k; write k, v
            rope_and_store, positions, cos, sin = step.rope
            q = rope_and_store(qkv, positions, step.slot_mapping, cos, sin, kv[0].flatten(0, 1),
                               kv[1].flatten(0, 1), H)
        else:
            qk = apply_rotary(qkv[:, :H + KV], step.cos, step.sin)   # q and k rotate together
            q, k, v = qk[:, :H], qk[:, H:], qkv[:, H + KV:]
            step.cache.store(self.layer, step.slot_mapping, k, v)
        if step.is_prefill:       # chunks (and decode rows): each query reads its sequence's cached
            out = step.backend.prefill(q, kv[0], kv[1], step)      # keys up to its own position
        else:                     # one new token per sequence reads its keys where they live
            out = step.backend.decode(q, kv[0], kv[1], step)
        out = self.o_proj(out.reshape(T, H * self.head_dim))     # this rank's heads' share of the sum
        return out if self.tp is None else self.tp.all_reduce(out)
