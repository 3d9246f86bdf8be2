"""The Llama/Qwen2 decoder: embedding, N x (attention + MLP), final norm, LM head; one rank's
share of it under tensor parallelism (parallel_layers.py)."""
from __future__ import annotations

import torch
from torch import nn

from common.model_config import ModelConfig

from .attention import Attention, StepContext
from .layers import MLP, RMSNorm, RotaryEmbedding
from .mla import MLAttention
from .parallel_layers import VocabParallelEmbedding, VocabParallelHead, rank_config, shard_rows
from .profiler import stage

# Checkpoint tensors packed into one fused parameter: fused name -> parts, in order.
PACKED = {"attn.qkv_proj": ("attn.q_proj", "attn.k_proj", "attn.v_proj"),
          "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, tp=None):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = MLAttention(cfg, layer, tp) if cfg.is_mla else Attention(cfg, layer, tp)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, tp)

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

    def __init__(self, cfg: ModelConfig, tp=None):
        """cfg: the checkpoint's; tp: this rank's process groups (parallel_state.py), None for one
        device. self.cfg is what this rank computes: its heads, KV heads and MLP slice."""
        super().__init__()
        self.rank, self.size = (tp.rank, tp.world_size) if tp else (0, 1)
        self.checkpoint_cfg, self.cfg = cfg, rank_config(cfg, self.rank, self.size)
        self.rotary = RotaryEmbedding(cfg)
        self.embed = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        self.layers = nn.ModuleList(DecoderLayer(self.cfg, i, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = VocabParallelHead(cfg.vocab_size, cfg.hidden_size, tp)
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

    def use_absorbed_decode(self, on: bool) -> None:
        """MLA: decode over the latents with W_UK and W_UV absorbed, or decompress the whole context
        every step (the ablation). Nothing to switch for grouped-query attention."""
        for module in self.modules():
            if isinstance(module, MLAttention):
                module.absorbed = on

    def use_fused_kernels(self, on: bool) -> None:
        """The fused Triton kernels (rope + store, add + norm, SiLU * mul) on a GPU, or torch's
        unfused ops (the ablation that splits p14's gain into graphs and fusion)."""
        for module in self.modules():
            if isinstance(module, (Model, RMSNorm, MLP)):
                module.fused = on

    def load_weights(self, checkpoint) -> None:
        """Read this rank's slices of the checkpoint's tensors (common.weights: a rank never holds
        a whole tensor it shards), packing q/k/v and gate/up into their fused parameters. A
        vocabulary that does not divide leaves the last rank's padding rows zero."""
        params = self.state_dict()
        for name, param in params.items():
            if name == "lm_head.weight" and self.cfg.tie_word_embeddings:
                continue
            tensor = torch.cat([checkpoint.read(part, shard_rows(part, self.checkpoint_cfg, self.rank, self.size),
                                                param.device, param.dtype) for part in checkpoint_parts(name)])
            with torch.no_grad():
                param[:len(tensor)].copy_(tensor)
                param[len(tensor):].zero_()


def checkpoint_parts(name: str) -> list[str]:
    """The checkpoint tensors one parameter packs (q/k/v, gate/up), in order; else itself."""
    for fused, parts in PACKED.items():
        if f".{fused}." in name:
            return [name.replace(fused, part) for part in parts]
    return [name]
