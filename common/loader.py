"""Resolve a model name (preset or local HF directory) and load its config, weights, tokenizer."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch
# At import, not on first use: an engine's worker processes fork from a server that imported the
# engine (multiprocessing's forkserver preload), so the config classes come in once there instead
# of ~2 s of transformers imports in every worker and engine process.
from transformers import AutoConfig, LlamaConfig, Qwen2Config  # noqa: F401

from . import smollm2
from .model_config import ModelConfig
from .presets import PRESETS, SMOLLM2, describe_presets
from .tokenizer import Tokenizer
from .weights import (RandomCheckpoint, SafetensorsCheckpoint, first_line, load_safetensors, param_shapes,
                      random_weights)


@dataclass
class ModelSource:
    """Where a model comes from, before any weights are read."""
    name: str
    kind: str                     # "gguf", "random" or "dir"
    hf_config: object             # transformers PretrainedConfig
    hf_dir: Path | None           # HF directory with real weights (None for random presets)
    seed: int = 0

    @cached_property
    def config(self) -> ModelConfig:
        try:
            return ModelConfig.from_hf(self.hf_config)
        except (AttributeError, TypeError, ValueError) as e:   # a field missing, mistyped, unsupported
            where = self.hf_dir / "config.json" if self.hf_dir else self.name
            raise ValueError(f"{where}: not a usable model config ({first_line(e)})") from None

    @cached_property
    def tokenizer(self) -> Tokenizer:
        # Random presets borrow SmolLM2's tokenizer (converted once, on first text use).
        return Tokenizer(self.hf_dir if self.hf_dir else smollm2.tokenizer_dir())

    @property
    def eos_token_ids(self) -> list[int]:
        eos = getattr(self.hf_config, "eos_token_id", None)
        return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))

    def load_weights(self, device: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """Weights under our names (see common.weights), on device, in dtype."""
        if self.hf_dir is not None:
            return load_safetensors(self.hf_dir, device, dtype, param_shapes(self.config))
        return random_weights(self.config, self.seed, device, dtype)

    def checkpoint(self):
        """The weights unread: .read(name, slices, device, dtype) reads one tensor, or only the
        slices of it a tensor-parallel rank holds (common.weights)."""
        if self.hf_dir is not None:
            return SafetensorsCheckpoint(self.hf_dir, param_shapes(self.config))
        return RandomCheckpoint(self.config, self.seed)


def resolve(name_or_path: str, seed: int = 0) -> ModelSource:
    """A preset name or a local HF directory (Llama or Qwen2 family); clear error otherwise."""
    if name_or_path in PRESETS:
        preset = PRESETS[name_or_path]
        if preset.kind == "gguf":
            folder = smollm2.converted_dir()
            return ModelSource(SMOLLM2, "gguf", AutoConfig.from_pretrained(str(folder)), folder)
        cfg = dict(preset.hf_config)
        hf_config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
        return ModelSource(preset.name, "random", hf_config, None, seed)
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        return ModelSource(str(path), "dir", read_hf_config(path), path)
    raise ValueError(f"unknown model {name_or_path!r}: not a preset and not a local HF directory "
                     f"with config.json.\nPresets:\n{describe_presets()}")


def read_hf_config(folder: Path):
    """config.json of a local HF directory; garbage (bad JSON, an unknown model_type) is one
    clear error naming the file instead of a transformers traceback."""
    try:
        return AutoConfig.from_pretrained(str(folder))
    except (OSError, ValueError, KeyError, TypeError) as e:   # JSONDecodeError is a ValueError
        raise ValueError(f"{folder / 'config.json'}: not a valid model config ({first_line(e)})") from None
