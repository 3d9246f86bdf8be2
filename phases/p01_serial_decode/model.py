"""The Llama/Qwen2 decoder: embedding, N x (attention + MLP), final norm, LM head."""
from __future__ import annotations

import torch
from torch import nn

from common.model_config import ModelConfig

from .attention import Attention
from .kv_cache import KVCache
from .layers import MLP, RMSNorm, RotaryEmbedding


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, rotary: RotaryEmbedding):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, layer, rotary)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, h, positions, start, cache):
        h = h + self.attn(self.attn_norm(h), positions, start, cache)
        return h + self.mlp(self.mlp_norm(h))


class Model(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        rotary = RotaryEmbedding(cfg)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, rotary) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, token_ids: torch.Tensor, start: int, cache: KVCache) -> torch.Tensor:
        """token_ids: (T,) new tokens at positions [start, start+T).
        Returns fp32 logits (vocab,) for the last token only: nothing else is sampled."""
        positions = torch.arange(start, start + token_ids.shape[0], device=token_ids.device)
        h = self.embed(token_ids)                              # (T, hidden)
        for layer in self.layers:
            h = layer(h, positions, start, cache)
        return self.lm_head(self.norm(h[-1])).float()

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy weights (our names, see common.weights) in; every parameter must be present."""
        expected = set(self.state_dict())
        if self.cfg.tie_word_embeddings:
            expected.discard("lm_head.weight")
        missing = expected - set(weights)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")
        self.load_state_dict(weights, strict=False)
