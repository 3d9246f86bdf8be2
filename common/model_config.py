"""ModelConfig: the architecture numbers an engine needs, read from an HF config."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "deepseek_v2")   # deepseek_v2: MLA attention, dense MLP only


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position: int
    tie_word_embeddings: bool
    qkv_bias: bool                      # Qwen2 has biases on q/k/v projections
    rope_scaling: dict | None = None    # None or Llama-3 style {"rope_type": "llama3", ...}
    # Multi-head latent attention (DeepSeek-V2, phase 17 on); 0 for grouped-query attention. Then
    # head_dim is a query's and a key's (qk_nope + qk_rope), and a token caches one latent of
    # kv_lora_rank values and one shared rotary key of qk_rope_head_dim values per layer.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    def __post_init__(self):
        """Sizes are positive ints and the heads group evenly: a config that breaks these would
        otherwise fail deep inside a forward pass, far from the file that caused it."""
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.kv_lora_rank and not 0 < self.qk_rope_head_dim < self.head_dim:
            raise ValueError(f"qk_rope_head_dim ({self.qk_rope_head_dim}) must be positive and below the "
                             f"query head dim ({self.head_dim})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads ({self.num_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_kv_heads})")

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def qk_nope_head_dim(self) -> int:
        return self.head_dim - self.qk_rope_head_dim

    @property
    def rope_dim(self) -> int:
        """The dims a rotary embedding turns: a whole head, or MLA's rotary part."""
        return self.qk_rope_head_dim if self.is_mla else self.head_dim

    @classmethod
    def from_hf(cls, hf) -> "ModelConfig":
        """Build from a transformers PretrainedConfig (Llama, Qwen2 or DeepSeek-V2 family)."""
        if hf.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {hf.model_type!r} is not supported; "
                             f"supported: {SUPPORTED_MODEL_TYPES}")
        if hf.model_type == "deepseek_v2":
            return cls._from_deepseek_v2(hf)
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        qkv_bias = hf.model_type == "qwen2" or bool(getattr(hf, "attention_bias", False))
        if getattr(hf, "mlp_bias", False):
            raise ValueError("mlp_bias=True checkpoints are not supported")
        return cls(
            model_type=hf.model_type, vocab_size=hf.vocab_size, hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size, num_layers=hf.num_hidden_layers,
            num_heads=hf.num_attention_heads,
            num_kv_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
            head_dim=head_dim, rms_norm_eps=hf.rms_norm_eps, rope_theta=_rope_theta(hf),
            max_position=hf.max_position_embeddings,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            qkv_bias=qkv_bias, rope_scaling=_rope_scaling(hf))

    @classmethod
    def _from_deepseek_v2(cls, hf) -> "ModelConfig":
        """DeepSeek-V2's attention (MLA) with dense MLPs: what phase 17 runs (MoE comes later)."""
        if getattr(hf, "q_lora_rank", None):
            raise ValueError("q_lora_rank (a low-rank query) is not supported: DeepSeek-V2-Lite's attention has none")
        if getattr(hf, "n_routed_experts", None) and hf.first_k_dense_replace < hf.num_hidden_layers:
            raise ValueError("MoE layers are not supported yet: first_k_dense_replace must cover every layer")
        if _rope_scaling(hf) is not None:
            raise ValueError("rope scaling (YaRN) is not supported for deepseek_v2 configs")
        return cls(
            model_type=hf.model_type, vocab_size=hf.vocab_size, hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size, num_layers=hf.num_hidden_layers,
            num_heads=hf.num_attention_heads, num_kv_heads=hf.num_attention_heads,
            head_dim=hf.qk_nope_head_dim + hf.qk_rope_head_dim, rms_norm_eps=hf.rms_norm_eps,
            rope_theta=_rope_theta(hf), max_position=hf.max_position_embeddings,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            qkv_bias=bool(getattr(hf, "attention_bias", False)), kv_lora_rank=hf.kv_lora_rank,
            qk_rope_head_dim=hf.qk_rope_head_dim, v_head_dim=hf.v_head_dim)

    def num_params(self) -> int:
        """Parameter count (embedding counted once when tied; q/k/v biases when present)."""
        d, f, hd = self.hidden_size, self.intermediate_size, self.head_dim
        attn = d * hd * (self.num_heads * 2 + self.num_kv_heads * 2)
        if self.is_mla:      # q, the latent and rotary key, the latent's norm, its up-projection, o
            h, r, v = self.num_heads, self.kv_lora_rank, self.v_head_dim
            attn = d * h * hd + d * (r + self.qk_rope_head_dim) + r + r * h * (self.qk_nope_head_dim + v) + h * v * d
        elif self.qkv_bias:
            attn += hd * (self.num_heads + self.num_kv_heads * 2)
        per_layer = attn + 3 * d * f + 2 * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.vocab_size * d + self.num_layers * per_layer + d + head

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """What a token's cache entry costs, every layer: K and V per KV head, or MLA's latent and
        shared rotary key (576 values for DeepSeek-V2 against 16 heads x 2 x 128 materialised)."""
        elem = torch.tensor([], dtype=dtype).element_size()
        if self.is_mla:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * elem
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem


def _rope_params(hf) -> dict:
    # transformers 5 keeps theta and scaling in `rope_parameters`; 4.x in rope_theta/rope_scaling.
    params = getattr(hf, "rope_parameters", None)
    return dict(params) if isinstance(params, dict) else {}


def _rope_theta(hf) -> float:
    return float(_rope_params(hf).get("rope_theta") or getattr(hf, "rope_theta", 10000.0))


def _rope_scaling(hf) -> dict | None:
    scaling = getattr(hf, "rope_scaling", None) or _rope_params(hf)
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type in (None, "default"):
        return None
    if rope_type != "llama3":
        raise ValueError(f"rope scaling {rope_type!r} is not supported (only default and llama3)")
    return dict(scaling)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """(rope_dim // 2,) fp32 inverse frequencies, with Llama-3 wavelength scaling if configured."""
    exponents = torch.arange(0, cfg.rope_dim, 2, dtype=torch.int64).float() / cfg.rope_dim
    inv_freq = 1.0 / (cfg.rope_theta ** exponents)
    if cfg.rope_scaling is None:
        return inv_freq
    return _llama3_scale(inv_freq, cfg.rope_scaling)


def _llama3_scale(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, blended, scaled)
