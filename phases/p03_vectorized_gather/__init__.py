"""Paged KV cache and continuous batching: a block manager, a scheduler, batched steps."""
from .engine import LLM

__all__ = ["LLM"]
