"""Chunked prefill: one token budget per step, decodes first, long prompts prefilled in chunks beside them."""
from .async_engine import AsyncLLM
from .engine import LLM
from .profiler import profile_decode
from .router import ParallelLLM
from .served import ServedLLM
from .server import build_app

__all__ = ["AsyncLLM", "LLM", "ParallelLLM", "ServedLLM", "build_app", "profile_decode"]
