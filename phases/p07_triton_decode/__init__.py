"""The engine with its own Triton kernel for paged decode attention among its attention backends."""
from .engine import LLM
from .profiler import profile_decode
from .router import ParallelLLM

__all__ = ["LLM", "ParallelLLM", "profile_decode"]
