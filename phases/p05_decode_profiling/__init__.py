"""The engine with a profile mode: torch.profiler ranges around every stage of a step."""
from .engine import LLM
from .profiler import profile_decode
from .router import ParallelLLM

__all__ = ["LLM", "ParallelLLM", "profile_decode"]
