"""The engine spread over processes and devices: data-parallel replicas, or a 2-stage pipeline."""
from .engine import LLM
from .router import ParallelLLM

__all__ = ["LLM", "ParallelLLM"]
