"""Device and dtype choices shared by every CLI."""
from __future__ import annotations

import re

import torch

DTYPES = {"float32": torch.float32, "fp32": torch.float32,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def default_device() -> str:
    """cuda when a GPU is present, else cpu."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> str:
    """bf16 on GPUs (what the benchmarks use), fp32 on CPU (what exact-match tests use)."""
    return "bfloat16" if device.startswith("cuda") else "float32"


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(set(DTYPES))}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_device(device: str) -> str:
    """cpu, cuda or cuda:N; anything else ("gpu", "mps", a typo) is refused by name."""
    if not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ValueError(f"unknown device {device!r}; use 'cpu', 'cuda' or 'cuda:N'")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but no CUDA GPU is available; use --device cpu")
    return device


def synchronize(device: str | torch.device) -> None:
    """Wait for queued GPU work so host clocks measure finished work."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def device_name(device: str) -> str:
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"
