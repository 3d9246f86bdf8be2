"""The engine whose attention reads K/V in place through block tables, behind pluggable backends."""
from .engine import LLM
from .profiler import profile_decode
from .router import ParallelLLM

__all__ = ["LLM", "ParallelLLM", "profile_decode"]
