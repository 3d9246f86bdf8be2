"""MLA: a paged cache of compressed latents, decode with the up-projections absorbed (DeepSeek-V2)."""
from .async_engine import AsyncLLM
from .engine import LLM
from .profiler import profile_decode
from .served import ServedLLM
from .server import build_app

__all__ = ["AsyncLLM", "LLM", "ServedLLM", "build_app", "profile_decode"]
