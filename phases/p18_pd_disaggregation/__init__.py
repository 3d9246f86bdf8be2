"""Prefill/decode disaggregation: a prefill engine and a decode engine in two processes, KV blocks moved between them."""
from .async_engine import AsyncLLM
from .engine import LLM
from .profiler import profile_decode
from .served import ServedLLM
from .server import build_app

__all__ = ["AsyncLLM", "LLM", "ServedLLM", "build_app", "profile_decode"]
