"""The Llama/Qwen2 decoder: embedding, N x (attention + MLP), final norm, LM head."""
from __future__ import annotations

import torch
from torch import nn

from common.model_config import ModelConfig

from .attention import Attention, StepContext
from .layers import MLP, RMSNorm, RotaryEmbedding
from .profiler import stage

# Checkpoint tensors packed into one fused parameter: fused name -> parts, in order.
PACKED = {"attn.qkv_proj": ("attn.q_proj", "attn.k_proj", "attn.v_proj"),
          "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, layer)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, step: StepContext):
        """x (T, hidden): the block output the stream has not added yet (layer 0: the embedding,
        residual None); residual (T, hidden): the stream. Returns both for the next layer: the
        hidden state is x + residual, added by the next norm (one kernel with it on a GPU)."""
        # Profiler stages: each norm and residual add counts with the block it feeds.
        with stage("attention"):
            h, residual = self.attn_norm(x, residual)
            x = self.attn(h, step)
        with stage("mlp"):
            h, residual = self.mlp_norm(x, residual)
            return self.mlp(h), residual


class Model(nn.Module):
    fused = True        # on a GPU, rotary + K/V write in one kernel (model_runner.step_context)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.rotary = RotaryEmbedding(cfg)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, token_ids: torch.Tensor, step: StepContext) -> torch.Tensor:
        """token_ids: (T,) new tokens of every sequence in the step, flat (see StepContext).
        Returns fp32 logits (B, vocab) for each sequence's last new token: nothing else is sampled."""
        with stage("embedding"):
            x, residual = self.embed(token_ids), None          # (T, hidden)
        for layer in self.layers:
            x, residual = layer(x, residual, step)
        with stage("lm_head"):                                 # the last add, the final norm and the head
            return self.lm_head(self.norm(x, residual)[0][step.last_rows]).float()

    def use_fused_kernels(self, on: bool) -> None:
        """The fused Triton kernels (rope + store, add + norm, SiLU * mul) on a GPU, or torch's
        unfused ops (the ablation that splits p14's gain into graphs and fusion)."""
        for module in self.modules():
            if isinstance(module, (Model, RMSNorm, MLP)):
                module.fused = on

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy checkpoint weights (our names, see common.weights) in, packing q/k/v and
        gate/up into their fused parameters; every parameter must be present."""
        params = self.state_dict()
        for name in params:
            if name == "lm_head.weight" and self.cfg.tie_word_embeddings:
                continue
            with torch.no_grad():
                params[name].copy_(self._checkpoint_tensor(name, weights))

    @staticmethod
    def _checkpoint_tensor(name: str, weights: dict[str, torch.Tensor]) -> torch.Tensor:
        for fused, parts in PACKED.items():
            if f".{fused}." in name:
                return torch.cat([weights[name.replace(fused, part)] for part in parts])
        if name not in weights:
            raise ValueError(f"checkpoint lacks tensor {name!r}")
        return weights[name]
