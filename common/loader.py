"""Resolve a model name (preset or local HF directory) and load its config, weights, tokenizer."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace

import torch

from . import smollm2
from .model_config import ModelConfig
from .presets import PRESETS, SMOLLM2, describe_presets
from .tokenizer import Tokenizer
from .weights import (RandomCheckpoint, SafetensorsCheckpoint, first_line, load_safetensors, param_shapes,
                      random_weights)


@dataclass
class ModelSource:
    """Where a model comes from, before any weights are read. A random preset's config is its own
    fields (common/presets.py, every one spelled out): an engine of it never imports transformers,
    whose config classes cost a process ~2 s of imports (each tensor-parallel rank, each prefill
    instance, each worker). transformers' object is built only where it is asked for (hf_config:
    an HF reference model, a config.json written out); tests/common/test_presets.py holds both
    paths to the same ModelConfig."""
    name: str
    kind: str                     # "gguf", "random" or "dir"
    hf_dir: Path | None           # HF directory with real weights (None for random presets)
    seed: int = 0
    hf: object | None = None      # transformers' config, read at resolve (a directory)
    fields: dict | None = None    # a random preset's HF config fields

    @cached_property
    def hf_config(self):
        """transformers PretrainedConfig."""
        if self.hf is not None:
            return self.hf
        from transformers import AutoConfig
        fields = dict(self.fields)
        return AutoConfig.for_model(fields.pop("model_type"), **fields)

    @cached_property
    def config(self) -> ModelConfig:
        try:
            return ModelConfig.from_hf(self.hf if self.hf is not None else SimpleNamespace(**self.fields))
        except (AttributeError, TypeError, ValueError) as e:   # a field missing, mistyped, unsupported
            where = self.hf_dir / "config.json" if self.hf_dir else self.name
            raise ValueError(f"{where}: not a usable model config ({first_line(e)})") from None

    @cached_property
    def tokenizer(self) -> Tokenizer:
        # Random presets borrow SmolLM2's tokenizer (converted once, on first text use).
        return Tokenizer(self.hf_dir if self.hf_dir else smollm2.tokenizer_dir())

    @property
    def eos_token_ids(self) -> list[int]:
        eos = getattr(self.hf, "eos_token_id", None) if self.hf is not None else self.fields.get("eos_token_id")
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
            return ModelSource(SMOLLM2, "gguf", folder, hf=read_hf_config(folder))
        return ModelSource(preset.name, "random", None, seed, fields=dict(preset.hf_config))
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        return ModelSource(str(path), "dir", path, hf=read_hf_config(path))
    raise ValueError(f"unknown model {name_or_path!r}: not a preset and not a local HF directory "
                     f"with config.json.\nPresets:\n{describe_presets()}")


def read_hf_config(folder: Path):
    """config.json of a local HF directory; garbage (bad JSON, an unknown model_type) is one
    clear error naming the file instead of a transformers traceback."""
    from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(str(folder))
    except (OSError, ValueError, KeyError, TypeError) as e:   # JSONDecodeError is a ValueError
        raise ValueError(f"{folder / 'config.json'}: not a valid model config ({first_line(e)})") from None
