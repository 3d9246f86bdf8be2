"""The engine that allocates KV blocks as sequences grow and preempts (recompute or swap) by priority."""
from .engine import LLM
from .profiler import profile_decode
from .router import ParallelLLM

__all__ = ["LLM", "ParallelLLM", "profile_decode"]
