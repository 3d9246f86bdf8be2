"""Speculative decoding: a proposer drafts k tokens per decoding sequence, the target scores them all in one step, and the agreeing prefix is kept."""
from .async_engine import AsyncLLM
from .engine import LLM
from .profiler import profile_decode
from .router import ParallelLLM
from .served import ServedLLM
from .server import build_app

__all__ = ["AsyncLLM", "LLM", "ParallelLLM", "ServedLLM", "build_app", "profile_decode"]
