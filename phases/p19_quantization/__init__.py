"""W8A8 quantization: the layers' Linears in int8 (or fp8) with per-channel weight and per-token activation scales, smoothed by a calibration text."""
from .async_engine import AsyncLLM
from .engine import LLM
from .profiler import profile_decode
from .served import ServedLLM
from .server import build_app

__all__ = ["AsyncLLM", "LLM", "ServedLLM", "build_app", "profile_decode"]
