"""Shared test set-up: repo root on sys.path, GPU auto-skip, and the session-wide HF reference.

Every phase's suite (tests/pNN_topic/) uses the same fixtures, so the HuggingFace greedy ids are
computed once per session per preset (see tests/reference.py) and every engine is held to them.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import reference  # noqa: E402  (needs the repo root on sys.path)


def pytest_collection_modifyitems(config, items):
    """Skip @pytest.mark.gpu tests on machines without CUDA (every other test runs on CPU)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def real_prompts() -> list[list[int]]:
    """The SmolLM2 prompt set as token ids (chat, plain, non-ASCII, > 512 tokens)."""
    return reference.prompts_for("smollm2-135m")


@pytest.fixture(scope="session")
def prompts_for():
    """prompts_for(preset): the reference prompt set of any preset in reference.REF_PRESETS."""
    return reference.prompts_for


@pytest.fixture(scope="session")
def hf_reference():
    """hf_reference(preset): HF greedy ids (fp32 CPU, 64 new tokens, EOS ignored) for
    prompts_for(preset), computed on first use and cached for the rest of the session."""
    return reference.hf_reference


@pytest.fixture(scope="session")
def tokenizer():
    """The SmolLM2 tokenizer (all presets share it)."""
    return reference.tokenizer()
