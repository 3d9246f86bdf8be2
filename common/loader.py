"""Resolve a model name (preset or local HF directory) and load its config, weights, tokenizer."""
from __future__ import annotations

import json
from dataclasses import dataclass
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

# transformers' config classes are imported on first use, not here: importing them pulls in
# torch._dynamo and torch.distributed.tensor (~2.5 s of a ~4 s start), and most processes never
# need them. A preset's fields are ours and complete (tests/common/test_presets.py holds what
# ModelConfig reads from them to what it reads from transformers' config), so an engine on a
# preset reads them as they are; only a user's HF directory goes through AutoConfig, for its
# defaults and its checks. Worker processes fork from a server that imported the engine
# (multiprocessing's forkserver preload): on presets they need no transformers at all.


@dataclass
class ModelSource:
    """Where a model comes from, before any weights are read."""
    name: str
    kind: str                     # "gguf", "random" or "dir"
    # What ModelConfig and the EOS ids are read from, by attribute: a preset's own fields (its dict,
    # or the converted SmolLM2's config.json) or, for a user's directory, transformers' config.
    fields: object
    hf_dir: Path | None           # HF directory with real weights (None for random presets)
    seed: int = 0

    @cached_property
    def hf_config(self):
        """The transformers PretrainedConfig (the HF reference model and tests build from it)."""
        if self.kind == "dir":
            return self.fields
        from transformers import AutoConfig
        if self.kind == "gguf":
            return AutoConfig.from_pretrained(str(self.hf_dir))
        settings = vars(self.fields).copy()
        return AutoConfig.for_model(settings.pop("model_type"), **settings)

    @cached_property
    def config(self) -> ModelConfig:
        try:
            return ModelConfig.from_hf(self.fields)
        except (AttributeError, TypeError, ValueError) as e:   # a field missing, mistyped, unsupported
            where = self.hf_dir / "config.json" if self.hf_dir else self.name
            raise ValueError(f"{where}: not a usable model config ({first_line(e)})") from None

    @cached_property
    def tokenizer(self) -> Tokenizer:
        if self.kind == "dir":
            return Tokenizer(self.hf_dir)
        # Every preset has SmolLM2's tokenizer (random presets borrow it; converted once, on first
        # text use), loaded with the class its tokenizer_config.json names, the one AutoTokenizer
        # picks for it (tests/common/test_tokenizer_chat.py), without AutoTokenizer's config import.
        folder = self.hf_dir or smollm2.tokenizer_dir()
        return Tokenizer(folder, json.loads((folder / "tokenizer_config.json").read_text())["tokenizer_class"])

    @property
    def eos_token_ids(self) -> list[int]:
        eos = getattr(self.fields, "eos_token_id", None)
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
            return ModelSource(SMOLLM2, "gguf", SimpleNamespace(**json.loads((folder / "config.json").read_text())),
                               folder)
        return ModelSource(preset.name, "random", SimpleNamespace(**preset.hf_config), None, seed)
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        return ModelSource(str(path), "dir", read_hf_config(path), path)
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
