"""The engine with a profile mode: torch.profiler ranges around every stage of a step."""
from .engine import LLM
from .profiler import profile_decode

__all__ = ["LLM", "profile_decode"]
