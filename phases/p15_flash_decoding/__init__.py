"""Flash decoding: split-K decode attention, a long context read by many programs at once."""
from .async_engine import AsyncLLM
from .engine import LLM
from .profiler import profile_decode
from .router import ParallelLLM
from .served import ServedLLM
from .server import build_app

__all__ = ["AsyncLLM", "LLM", "ParallelLLM", "ServedLLM", "build_app", "profile_decode"]
