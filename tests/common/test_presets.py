"""Presets, ModelConfig, parameter shapes, name mapping and Llama-3 RoPE scaling."""
import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from common.loader import resolve
from common.model_config import ModelConfig, rope_inv_freq
from common.presets import PRESETS
from common.weights import hf_to_ours, ours_to_hf, param_shapes


def _hf_meta_model(hf_config):
    """The transformers model of a config on the meta device: shapes only, no memory."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config)


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_num_params(name):
    """Every preset resolves and num_params == sum of param_shapes == transformers' own count."""
    source = resolve(name)
    cfg = source.config
    assert source.name == name
    total = sum(math.prod(s) for s in param_shapes(cfg).values())
    assert cfg.num_params() == total
    assert total == sum(p.numel() for p in _hf_meta_model(source.hf_config).parameters())


@pytest.mark.parametrize("name", list(PRESETS))
def test_param_shapes_match_transformers(name):
    """Our names map to transformers' parameter names with the same shapes (tied head aside)."""
    source = resolve(name)
    hf = {k: tuple(v.shape) for k, v in _hf_meta_model(source.hf_config).state_dict().items()}
    ours = ours_to_hf(param_shapes(source.config))
    assert {k: hf[k] for k in ours} == ours
    missing = set(hf) - set(ours)
    assert missing == ({"lm_head.weight"} if source.config.tie_word_embeddings else set())


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_fields_read_as_transformers_reads_them(name):
    """An engine on a preset reads the preset's own fields (common/loader.py: no transformers
    import in its process); they give the same ModelConfig and EOS ids as transformers' config of
    the same preset, defaults and rope_parameters included."""
    source = resolve(name)
    assert source.config == ModelConfig.from_hf(source.hf_config)
    eos = source.hf_config.eos_token_id
    assert source.eos_token_ids == ([eos] if isinstance(eos, int) else list(eos))


@pytest.mark.parametrize("name, expected", [("llama-1b", 1.236e9), ("llama-8b", 8.03e9),
                                            ("qwen2-0.5b", 0.494e9), ("smollm2-135m", 0.1345e9)])
def test_known_sizes(name, expected):
    """Shapes reproduce the published sizes of the models they imitate."""
    assert resolve(name).config.num_params() == pytest.approx(expected, rel=2e-3)


def test_real_model_config():
    """SmolLM2-135M: 30 layers, 9 heads / 3 kv heads of 64, tied head, theta 1e5."""
    cfg = resolve("smollm2-135m").config
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (30, 9, 3, 64)
    assert cfg.tie_word_embeddings and cfg.rope_theta == 100000.0 and cfg.rope_scaling is None


def test_qwen2_has_qkv_bias():
    """Qwen2 presets get q/k/v biases, Llama presets none."""
    assert resolve("tiny-qwen2").config.qkv_bias
    assert not resolve("tiny-llama").config.qkv_bias


def test_name_round_trip():
    """hf_to_ours(ours_to_hf(name)) == name for every parameter of both families."""
    for name in ("tiny-llama", "tiny-qwen2"):
        shapes = param_shapes(resolve(name).config)
        hf_names = ours_to_hf(shapes)
        assert len(hf_names) == len(shapes)
        assert {hf_to_ours(k) for k in hf_names} == set(shapes)


def test_hf_to_ours_skips_unknown():
    """Tensors we do not use (e.g. rotary caches) map to None."""
    assert hf_to_ours("model.layers.0.self_attn.rotary_emb.inv_freq") is None
    assert hf_to_ours("model.layers.11.mlp.down_proj.weight") == "layers.11.mlp.down_proj.weight"


LLAMA3_SCALING = [
    dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
         original_max_position_embeddings=8192),                      # Llama 3.2
    dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
         original_max_position_embeddings=8192),                      # Llama 3.1
    dict(rope_type="llama3", factor=4.0, low_freq_factor=2.0, high_freq_factor=8.0,
         original_max_position_embeddings=4096),
]


@pytest.mark.parametrize("scaling", LLAMA3_SCALING)
def test_llama3_rope_matches_transformers(scaling):
    """rope_inv_freq with llama3 scaling equals transformers' ROPE_INIT_FUNCTIONS['llama3']."""
    hf = AutoConfig.for_model("llama", hidden_size=2048, num_attention_heads=32, head_dim=64,
                              rope_theta=500000.0, max_position_embeddings=131072, rope_scaling=scaling)
    cfg = ModelConfig.from_hf(hf)
    assert cfg.rope_scaling["rope_type"] == "llama3"
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    ours = rope_inv_freq(cfg)
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-6, atol=0)
    plain = rope_inv_freq(ModelConfig.from_hf(AutoConfig.for_model(
        "llama", hidden_size=2048, num_attention_heads=32, head_dim=64, rope_theta=500000.0)))
    changed = ~torch.isclose(ours, plain)
    assert changed.any() and not changed.all()     # low frequencies scaled, high ones kept
    assert (ours <= plain).all()


def test_unsupported_rope_scaling():
    """Rope scalings other than default and llama3 are refused clearly."""
    hf = AutoConfig.for_model("llama", hidden_size=64, num_attention_heads=4,
                              rope_scaling=dict(rope_type="linear", factor=2.0))
    with pytest.raises(ValueError, match="rope scaling 'linear' is not supported"):
        ModelConfig.from_hf(hf)


def test_unknown_preset_lists_presets():
    """resolve() of an unknown name lists the preset names."""
    with pytest.raises(ValueError, match="not a preset") as err:
        resolve("llama-70b")
    for name in PRESETS:
        assert name in str(err.value)
