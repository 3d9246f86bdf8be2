"""Multi-head latent attention (DeepSeek-V2): a cache of compressed latents, decode with the
up-projections absorbed.

Per token and layer the pool keeps one row of W = kv_lora_rank + qk_rope_head_dim values:
    [ c (kv_lora_rank): RMSNorm(x W_DKV), the latent | k_pe (qk_rope_head_dim): x W_KR, rotated ]
From it every head's key and value can be rebuilt: head h's key is [c W_UK_h | k_pe] (k_pe shared
by all heads), its value c W_UV_h, where W_UK_h (nope, r) and W_UV_h (v, r) are head h's rows of
kv_b_proj. DeepSeek-V2-Lite: 576 cached values a token and layer, against 16 heads x (192 + 128)
= 5,120 had the keys and values been cached per head.

Two ways to attend:
  decompress (prefill, and the naive decode):  rebuild K (ctx, H, nope + rope) and V (ctx, H, v)
      for the sequence's whole context, then ordinary causal attention. Decode pays
      ctx x r x H x (nope + v) multiply-adds a step to rebuild what it read.
  absorbed (decode):  q_h . k_h(t) = (W_UK_h^T q_nope_h) . c(t) + q_pe_h . k_pe(t), and
      sum_t p(t) v_h(t) = W_UV_h (sum_t p(t) c(t)). So fold W_UK into the query once (a query of
      W values per head), attend over the cached rows directly (one W-wide key and one r-wide value
      shared by every head: MQA with H query heads), and apply W_UV to the r-wide result.
      The per-token work is what the cache holds; nothing is rebuilt.

The rotary part uses DeepSeek's layout: pairs (x[2i], x[2i+1]) rotate by frequency i (HF's
complex multiplication), not Llama's halves.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common.model_config import ModelConfig

from .layers import RMSNorm


class MLAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, tp=None, absorbed: bool = True):
        """cfg: this rank's share of the model (its heads); tp: process groups, or None. The latent
        and its projection are every rank's (replicated): only the heads split."""
        super().__init__()
        self.layer, self.tp, self.absorbed = layer, tp, absorbed
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.nope, self.rope, self.rank, self.v_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank, cfg.v_head_dim
        self.scale = cfg.head_dim ** -0.5                  # a query's width: nope + rope
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, self.rank + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(self.rank, cfg.num_heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * self.v_dim, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, step) -> torch.Tensor:
        T, H = x.shape[0], self.num_heads
        q = self.q_proj(x).view(T, H, self.head_dim)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([self.rank, self.rope], dim=-1)
        q_pe, k_pe = rotate_pairs(q_pe, step.cos, step.sin), rotate_pairs(k_pe[:, None], step.cos, step.sin)[:, 0]
        row = torch.cat([self.kv_a_layernorm(latent.contiguous())[0], k_pe], dim=-1)     # (T, W): what is cached
        step.cache.store_latent(self.layer, step.slot_mapping, row)
        pool = step.cache.layers[self.layer][0].flatten(0, 1)[:, 0]                  # (slots, W), a view
        if step.is_prefill or not self.absorbed:
            out = self._decompressed(q_nope, q_pe, pool, step)
        else:
            out = self._absorbed(q_nope, q_pe, step)
        out = self.o_proj(out.reshape(T, H * self.v_dim))
        return out if self.tp is None else self.tp.all_reduce(out)

    def up_projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK (H, nope, r) and W_UV (H, v, r): kv_b_proj's rows, head by head (views)."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_dim, self.rank)
        return w[:, :self.nope], w[:, self.nope:]

    def _decompressed(self, q_nope, q_pe, pool, step) -> torch.Tensor:
        """Each sequence's context rebuilt into per-head K and V, then causal attention: (T, H, v)."""
        w_uk, w_uv = self.up_projections()
        out, q = [], torch.cat([q_nope, q_pe], dim=-1)
        spans = zip(step.cu_seqlens_q_host, step.cu_seqlens_q_host[1:], step.context_lens_host)
        for b, (a, e, context) in enumerate(spans):
            rows = pool[context_slots(step, b, context)]                            # (ctx, W)
            c, k_pe = rows[:, :self.rank], rows[:, self.rank:]
            k = torch.cat([torch.einsum("tr,hnr->thn", c, w_uk), k_pe[:, None].expand(-1, self.num_heads, -1)], -1)
            v = torch.einsum("tr,hvr->thv", c, w_uv)
            out.append(causal(q[a:e], k, v, self.scale))
        return torch.cat(out)

    def _absorbed(self, q_nope, q_pe, step) -> torch.Tensor:
        """One token per sequence: W_UK folded into the query, attention over the latents, W_UV after."""
        w_uk, w_uv = self.up_projections()
        q = torch.cat([torch.einsum("thn,hnr->thr", q_nope, w_uk), q_pe], dim=-1)   # (B, H, W)
        latent_out = step.backend.latent_decode(q.contiguous(), step.cache.layers[self.layer][0], self.rank,
                                                self.scale, step)                     # (B, H, r)
        return torch.einsum("thr,hvr->thv", latent_out, w_uv)


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (T, n, rope): pairs (x[2i], x[2i+1]) rotated by frequency i, in fp32, back in x's dtype.
    cos, sin (T, 1, rope): the engine's tables, frequencies in halves [f_0..f_{d/2-1}, again]."""
    half = x.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]
    even, odd = x.float()[..., 0::2], x.float()[..., 1::2]
    return torch.stack([even * c - odd * s, even * s + odd * c], dim=-1).flatten(-2).to(x.dtype)


def context_slots(step, b: int, context: int) -> torch.Tensor:
    """Pool slots of sequence b's first `context` tokens, through its block table (int64)."""
    block_size = step.cache.block_size
    blocks = step.block_tables[b, :-(-context // block_size)].long()
    offsets = torch.arange(block_size, device=blocks.device)
    return (blocks[:, None] * block_size + offsets[None, :]).flatten()[:context]


def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q (n, H, D) at the last n of k's positions; k (ctx, H, D), v (ctx, H, v): query i sees keys
    [0, ctx - n + i]. SDPA takes a value narrower than the key (its efficient and math kernels),
    and never holds the (n, ctx) scores of every head at once in fp32 as a spelled-out softmax would."""
    n, ctx = q.shape[0], k.shape[0]
    mask = None if n == 1 else torch.ones(n, ctx, dtype=torch.bool, device=q.device).tril(ctx - n)
    out = F.scaled_dot_product_attention(*(x.transpose(0, 1)[None] for x in (q, k, v)), attn_mask=mask, scale=scale)
    return out[0].transpose(0, 1)


def latent_decode_reference(q: torch.Tensor, pool: torch.Tensor, rank: int, scale: float, step) -> torch.Tensor:
    """The absorbed decode's attention, in torch (the reference a kernel must match): q (B, H, W)
    over each sequence's cached rows (pool (num_blocks, block_size, 1, W)), keys all W columns,
    values the first `rank`. Padded to the longest context and masked. -> (B, H, rank)."""
    B, block_size = q.shape[0], pool.shape[1]
    width = -(-step.max_context_len // block_size)
    rows = pool[step.block_tables[:, :width].long()].flatten(1, 3)[:, :step.max_context_len]  # (B, S, W)
    scores = torch.einsum("bhw,bsw->bhs", q.float(), rows.float()) * scale
    real = torch.arange(rows.shape[1], device=q.device)[None, :] < step.context_lens[:, None]
    probs = scores.masked_fill(~real[:, None, :], float("-inf")).softmax(dim=-1)
    return torch.einsum("bhs,bsr->bhr", probs, rows[..., :rank].float()).to(q.dtype)
