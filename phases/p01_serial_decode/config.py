"""EngineConfig: every knob of this engine, validated once."""
from __future__ import annotations

from dataclasses import dataclass

from common.device import check_device, default_device, default_dtype, parse_dtype


@dataclass
class EngineConfig:
    model: str = "smollm2-135m"      # preset name or local HF directory
    device: str | None = None        # default: cuda when present, else cpu
    dtype: str | None = None         # default: bfloat16 on cuda, float32 on cpu
    max_model_len: int | None = None  # prompt + output tokens; default: the model's max position
    seed: int = 0                    # weights of random presets, and unseeded sampling

    def __post_init__(self):
        self.device = check_device(self.device or default_device())
        self.dtype = self.dtype or default_dtype(self.device)
        self.torch_dtype = parse_dtype(self.dtype)
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise ValueError(f"max_model_len must be positive, got {self.max_model_len}")

    def resolve_max_model_len(self, model_max_position: int) -> int:
        if self.max_model_len is None:
            return model_max_position
        if self.max_model_len > model_max_position:
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the model's "
                             f"max_position_embeddings {model_max_position}")
        return self.max_model_len
