"""Megatron-style sharding of a Llama/Qwen2 model over N ranks: which slice of every checkpoint
tensor a rank holds, and the two layers whose forward changes (the vocabulary-parallel embedding
and LM head). The attention and MLP blocks keep their code; their all-reduce is one line each.

    q/k/v, gate/up  column-parallel: rank r holds its heads' (its intermediate slice's) output rows;
                    no communication, each rank computes its own heads' attention
    o, down         row-parallel: rank r holds the matching input columns and computes a partial
                    sum of the output; one all-reduce adds the N partials (2 per layer)
    embedding       vocabulary-parallel: rank r holds rows [r*V/N, (r+1)*V/N); a token outside
                    them looks up zeros, and one all-reduce assembles every token's row
    LM head         vocabulary-parallel: rank r computes its slice of the logits, one all-gather
                    assembles them (the logits of a step, (R, V), are small)
    norms           replicated

Per token and layer the all-reduces move 2 x hidden values per rank (x 2 (N-1)/N on the wire
for a ring); the KV pool of a rank holds only its KV heads. With more ranks than KV heads a KV
head is replicated: rank r uses KV head r // (N / num_kv_heads), as its query heads need.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from common.model_config import ModelConfig


def check_shardable(cfg: ModelConfig, size: int) -> None:
    """Refuse a degree the heads do not split into: every rank needs whole query heads, and whole
    KV heads or a whole share of one."""
    if cfg.num_heads % size:
        raise ValueError(f"tensor_parallel_size {size} must divide num_attention_heads ({cfg.num_heads})")
    if not cfg.is_mla and cfg.num_kv_heads % size and size % cfg.num_kv_heads:
        raise ValueError(f"tensor_parallel_size {size} must divide num_key_value_heads ({cfg.num_kv_heads}) "
                         f"or be a multiple of it (then each KV head is replicated)")


def rank_config(cfg: ModelConfig, rank: int, size: int) -> ModelConfig:
    """The model rank `rank` computes: its heads, its KV heads, its slice of the MLP (the
    vocabulary stays whole: only the embedding and head layers below know it is split)."""
    if size == 1:
        return cfg
    start, stop = split(cfg.intermediate_size, rank, size)
    return dataclasses.replace(cfg, num_heads=cfg.num_heads // size, num_kv_heads=max(1, cfg.num_kv_heads // size),
                               intermediate_size=stop - start)


def split(n: int, rank: int, size: int) -> tuple[int, int]:
    """Rank `rank`'s contiguous share [start, stop) of n, in parts of ceil(n / size) (the last
    may be shorter: an intermediate size or a vocabulary that does not divide)."""
    part = -(-n // size)
    return min(n, rank * part), min(n, (rank + 1) * part)


def kv_head_range(cfg: ModelConfig, rank: int, size: int) -> tuple[int, int]:
    if size <= cfg.num_kv_heads:
        return split(cfg.num_kv_heads, rank, size)
    head = rank // (size // cfg.num_kv_heads)         # replicated: the one its query heads read
    return head, head + 1


def shard_rows(name: str, cfg: ModelConfig, rank: int, size: int) -> list[tuple[int, int, int]]:
    """Which slices of checkpoint tensor `name` (our names) rank `rank` holds, concatenated in
    order along their dim: [(dim, start, stop), ...]; [] = the whole tensor (replicated)."""
    hd = cfg.head_dim
    if cfg.is_mla:
        return mla_shard_rows(name, cfg, rank, size)
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        start, stop = split(cfg.num_heads, rank, size)
        return [(0, start * hd, stop * hd)]
    if name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
        start, stop = kv_head_range(cfg, rank, size)
        return [(0, start * hd, stop * hd)]
    if name.endswith("o_proj.weight"):
        start, stop = split(cfg.num_heads, rank, size)
        return [(1, start * hd, stop * hd)]
    if name.endswith(("gate_proj.weight", "up_proj.weight")):
        return [(0, *split(cfg.intermediate_size, rank, size))]
    if name.endswith("down_proj.weight"):
        return [(1, *split(cfg.intermediate_size, rank, size))]
    if name in ("embed.weight", "lm_head.weight"):
        return [(0, *split(cfg.vocab_size, rank, size))]
    return []


def mla_shard_rows(name: str, cfg: ModelConfig, rank: int, size: int) -> list[tuple[int, int, int]]:
    """MLA (mla.py): q and the latent's up-projection split by head (column-parallel), o by head's
    value columns (row-parallel); the latent's projection and norm are every rank's, and so is the
    cache: each rank holds every token's latent (see the README for what that costs)."""
    start, stop = split(cfg.num_heads, rank, size)
    per_head = {"q_proj.weight": (0, cfg.head_dim), "kv_b_proj.weight": (0, cfg.qk_nope_head_dim + cfg.v_head_dim),
                "o_proj.weight": (1, cfg.v_head_dim)}
    for suffix, (dim, width) in per_head.items():
        if name.endswith("attn." + suffix):
            return [(dim, start * width, stop * width)]
    if "attn." in name:
        return []
    return shard_rows(name, dataclasses.replace(cfg, kv_lora_rank=0, qk_rope_head_dim=0), rank, size)


class VocabParallelEmbedding(nn.Module):
    """Rows [start, stop) of the embedding table, padded to ceil(V / N) rows on every rank."""

    def __init__(self, vocab_size: int, dim: int, tp=None):
        super().__init__()
        rank, size = (tp.rank, tp.world_size) if tp else (0, 1)
        self.tp, self.vocab_size = tp, vocab_size
        self.start, self.stop = split(vocab_size, rank, size)
        self.weight = nn.Parameter(torch.empty(-(-vocab_size // size), dim))

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.tp is None:
            return F.embedding(token_ids, self.weight)
        mine = (token_ids >= self.start) & (token_ids < self.stop)
        x = F.embedding((token_ids - self.start) * mine, self.weight) * mine[:, None].to(self.weight.dtype)
        return self.tp.all_reduce(x)             # every token's row lives on exactly one rank


class VocabParallelHead(nn.Module):
    """The LM head over this rank's vocabulary rows; the logits gathered once, trimmed to V."""

    def __init__(self, vocab_size: int, dim: int, tp=None):
        super().__init__()
        self.tp, self.vocab_size = tp, vocab_size
        self.weight = nn.Parameter(torch.empty(-(-vocab_size // (tp.world_size if tp else 1)), dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.weight)                          # (R, ceil(V / N))
        if self.tp is not None:
            logits = self.tp.all_gather_last(logits)[:, :self.vocab_size]
        return logits
