"""Serial decode: one request at a time, prefill then a token-by-token loop over a KV cache."""
from .engine import LLM

__all__ = ["LLM"]
