"""Weight files and names: HF safetensors in, our short parameter names out.

Every phase's model uses the same short names, so one mapping serves all of them:
  model.layers.3.self_attn.q_proj.weight -> layers.3.attn.q_proj.weight
"""
from __future__ import annotations

import contextlib
import re
import zlib
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .model_config import ModelConfig

# (HF pattern, our name); applied in order, first match wins.
HF_TO_OURS = [
    (r"^model\.embed_tokens\.", "embed."),
    (r"^model\.norm\.", "norm."),
    (r"^lm_head\.", "lm_head."),
    (r"^model\.layers\.(\d+)\.input_layernorm\.", r"layers.\1.attn_norm."),
    (r"^model\.layers\.(\d+)\.post_attention_layernorm\.", r"layers.\1.mlp_norm."),
    (r"^model\.layers\.(\d+)\.self_attn\.", r"layers.\1.attn."),
    (r"^model\.layers\.(\d+)\.mlp\.", r"layers.\1.mlp."),
]
OURS_TO_HF = [
    (r"^embed\.", "model.embed_tokens."), (r"^norm\.", "model.norm."), (r"^lm_head\.", "lm_head."),
    (r"^layers\.(\d+)\.attn_norm\.", r"model.layers.\1.input_layernorm."),
    (r"^layers\.(\d+)\.mlp_norm\.", r"model.layers.\1.post_attention_layernorm."),
    (r"^layers\.(\d+)\.attn\.", r"model.layers.\1.self_attn."),
    (r"^layers\.(\d+)\.mlp\.", r"model.layers.\1.mlp."),
]


@contextlib.contextmanager
def skip_init():
    """Build a model whose parameters are left uninitialized: its load_weights() then overwrites
    every one (and refuses a checkpoint that lacks any). nn.Linear's and nn.Embedding's random
    init is otherwise thrown away, and costs about a second for SmolLM2-135M on a CPU core.
    Buffers computed at construction (rotary tables) and torch.ones norms are built as usual."""
    names = ("kaiming_uniform_", "uniform_", "normal_")
    saved = {n: getattr(torch.nn.init, n) for n in names}
    for n in names:
        setattr(torch.nn.init, n, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(torch.nn.init, n, fn)


def _rename(name: str, table) -> str | None:
    for pattern, repl in table:
        new, n = re.subn(pattern, repl, name)
        if n:
            return new
    return None


def hf_to_ours(name: str) -> str | None:
    """Our name for an HF tensor name; None for tensors we do not use (e.g. rotary caches)."""
    if ".rotary_emb." in name:          # old checkpoints store inv_freq; we recompute it
        return None
    return _rename(name, HF_TO_OURS)


def ours_to_hf(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {_rename(k, OURS_TO_HF): v for k, v in weights.items()}


def load_safetensors(folder: Path, device: str, dtype: torch.dtype,
                     shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """All *.safetensors in `folder`, renamed to our names, cast to dtype on device.

    `shapes` (param_shapes of the model) is checked before a byte is copied: every tensor must be
    one the model has, with exactly its shape, and none may be missing. The model copies weights
    in with Tensor.copy_, which broadcasts: without this check a 1-element norm weight or a
    one-row lm_head would load without a word and generate garbage. Every error names the file
    and the tensor (by the name the file uses)."""
    checkpoint = SafetensorsCheckpoint(folder, shapes)
    return {name: checkpoint.read(name, [], device, dtype) for name in shapes}


# A slice of a tensor: (dim, start, stop). A rank of a tensor-parallel engine reads only its own.
Slices = list[tuple[int, int, int]]


def read_slices(tensor, slices: Slices):
    """The slices of `tensor` (a torch tensor or a safetensors slice, which reads only them),
    concatenated along their dim; [] = the whole tensor."""
    if not slices:
        return tensor[:]
    parts = [tensor[start:stop] if dim == 0 else tensor[:, start:stop] for dim, start, stop in slices]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=slices[0][0])


class SafetensorsCheckpoint:
    """The *.safetensors of a folder, open, every shape checked; a tensor (or a slice of it) is
    read from disk only when asked for: a rank of a sharded model reads its slices, no more."""

    def __init__(self, folder: Path, shapes: dict[str, tuple[int, ...]]):
        files = sorted(Path(folder).glob("*.safetensors"))
        if not files:
            raise ValueError(f"{folder}: no *.safetensors files in this model directory")
        self.where: dict[str, tuple[Path, object, str]] = {}     # ours -> (file, open handle, its name)
        for file in files:
            with _naming(file):
                handle = safe_open(str(file), framework="pt", device="cpu")
                for hf_name in handle.keys():
                    ours = hf_to_ours(hf_name)
                    if ours is not None:
                        _check_shape(file, hf_name, ours, tuple(handle.get_slice(hf_name).get_shape()), shapes)
                        if ours in shapes:
                            self.where[ours] = (file, handle, hf_name)
        missing = [hf_name_of(name) for name in shapes if name not in self.where]
        if missing:
            raise ValueError(f"{folder}: the checkpoint lacks {len(missing)} tensor(s) the model needs, "
                             f"e.g. {missing[0]!r}")

    def read(self, name: str, slices: Slices, device: str, dtype: torch.dtype) -> torch.Tensor:
        file, handle, hf_name = self.where[name]
        with _naming(file):
            return read_slices(handle.get_slice(hf_name), slices).to(device=device, dtype=dtype)


class RandomCheckpoint:
    """A random preset's weights as a checkpoint: each tensor drawn whole when read (seeded by its
    name, so every rank draws the same one), then sliced."""

    def __init__(self, cfg: ModelConfig, seed: int):
        self.shapes, self.seed = param_shapes(cfg), seed

    def read(self, name: str, slices: Slices, device: str, dtype: torch.dtype) -> torch.Tensor:
        return read_slices(_random_tensor(name, self.shapes[name], self.seed, device, dtype), slices)


@contextlib.contextmanager
def _naming(file: Path):
    """A truncated or garbled file is one clear error naming it."""
    try:
        yield
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{file}: not a readable safetensors file ({first_line(e)})") from None


def _check_shape(file: Path, hf_name: str, ours: str, shape: tuple, shapes: dict) -> None:
    if ours not in shapes:
        if ours == "lm_head.weight":     # a tied model's copy of the embedding: not used
            return
        raise ValueError(f"{file}: tensor {hf_name!r} is not part of this model (check config.json: "
                         f"e.g. attention_bias, num_hidden_layers)")
    if shape != shapes[ours]:
        raise ValueError(f"{file}: tensor {hf_name!r} has shape {list(shape)}, the model needs "
                         f"{list(shapes[ours])} (from config.json)")


def first_line(e: Exception) -> str:
    """The first line of an error's message: enough to say what was wrong, in one line."""
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def hf_name_of(name: str) -> str:
    """The name a checkpoint file uses for our parameter `name`."""
    return _rename(name, OURS_TO_HF)


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of a Llama/Qwen2 model under our names."""
    d, hd, f = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd
    shapes = {"embed.weight": (cfg.vocab_size, d), "norm.weight": (d,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, d)
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        if cfg.is_mla:
            shapes |= mla_shapes(cfg, p)
            continue
        shapes |= {p + "attn_norm.weight": (d,), p + "mlp_norm.weight": (d,),
                   p + "attn.q_proj.weight": (q, d), p + "attn.k_proj.weight": (kv, d),
                   p + "attn.v_proj.weight": (kv, d), p + "attn.o_proj.weight": (d, q),
                   p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                   p + "mlp.down_proj.weight": (d, f)}
        if cfg.qkv_bias:
            shapes |= {p + "attn.q_proj.bias": (q,), p + "attn.k_proj.bias": (kv,), p + "attn.v_proj.bias": (kv,)}
    return shapes


def mla_shapes(cfg: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    """One DeepSeek-V2 layer (dense MLP): q, the latent + rotary key, the latent's norm, the latent's
    up-projection to each head's key (no rope part) and value, o."""
    d, f, h, r = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.kv_lora_rank
    return {p + "attn_norm.weight": (d,), p + "mlp_norm.weight": (d,),
            p + "attn.q_proj.weight": (h * cfg.head_dim, d),
            p + "attn.kv_a_proj_with_mqa.weight": (r + cfg.qk_rope_head_dim, d),
            p + "attn.kv_a_layernorm.weight": (r,),
            p + "attn.kv_b_proj.weight": (h * (cfg.qk_nope_head_dim + cfg.v_head_dim), r),
            p + "attn.o_proj.weight": (d, h * cfg.v_head_dim),
            p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d), p + "mlp.down_proj.weight": (d, f)}


def random_weights(cfg: ModelConfig, seed: int, device: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Seeded random weights, drawn on `device` (deterministic per device and seed).

    Scales keep activations O(1) through the stack so logits are well separated and greedy
    decoding is not decided by rounding: linears and embeddings ~ N(0, 1/hidden). Block outputs
    (o_proj, down_proj) are 4x larger so that the residual stream is not just the input
    embedding; with a tied head that makes a model repeat its last token forever.
    """
    return {name: _random_tensor(name, shape, seed, device, dtype)
            for name, shape in param_shapes(cfg).items()}


def _random_tensor(name, shape, seed, device, dtype) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    if name.endswith("norm.weight"):
        return torch.ones(shape, device=device, dtype=dtype)
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    if name.endswith("bias"):
        x *= 0.1
    else:
        x *= shape[-1] ** -0.5 * (4.0 if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0)
    return x.to(dtype)
