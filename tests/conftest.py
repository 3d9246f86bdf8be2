"""Shared test set-up: repo root on sys.path, GPU auto-skip, worker-process tests run once per
worker code, and the session-wide HF reference.

Every phase's suite (tests/pNN_topic/) uses the same fixtures, so the HuggingFace greedy ids are
computed once per session per preset (see tests/reference.py) and every engine is held to them.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import reference  # noqa: E402  (needs the repo root on sys.path)


WORKER_CODE = ("worker.py", "worker_pool.py")


def worker_code_changed(phase: str) -> bool:
    """Whether a phase's worker processes run other code than the phase before's: its first
    phase, or worker.py / worker_pool.py differ from the previous phase folder's."""
    folders = sorted(p.name for p in (ROOT / "phases").iterdir() if p.name[:1] == "p" and p.is_dir())
    before = folders[folders.index(phase) - 1] if folders.index(phase) else None
    return before is None or any(
        not (ROOT / "phases" / before / name).exists()
        or (ROOT / "phases" / before / name).read_bytes() != (ROOT / "phases" / phase / name).read_bytes()
        for name in WORKER_CODE)


def pytest_collection_modifyitems(config, items):
    """Skip @pytest.mark.gpu tests on machines without CUDA (every other test runs on CPU), and
    deselect @pytest.mark.worker_code tests in a phase whose worker code is the phase before's
    byte for byte: they exercise processes (spawn, a killed parent, a dead worker), cost seconds
    each, and would test the same code again."""
    repeated = [item for item in items if "worker_code" in item.keywords
                and not worker_code_changed(item.module.PHASE)]
    if repeated:
        config.hook.pytest_deselected(items=repeated)
        items[:] = [item for item in items if item not in repeated]
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


# --- the phase under test -----------------------------------------------------------------------
# The engine suites in tests/suites/ are written once; tests/pNN_topic/test_<suite>.py imports a
# suite and sets PHASE (and PREVIOUS, for suites that compare two phases). These fixtures read it.

@pytest.fixture(scope="module")
def phase(request) -> str:
    return request.module.PHASE


@pytest.fixture(scope="module")
def LLM(phase):  # noqa: N802 - named like the class it returns, so suites read naturally
    return importlib.import_module(f"phases.{phase}").LLM


@pytest.fixture(scope="module")
def PrevLLM(request):  # noqa: N802
    return importlib.import_module(f"phases.{request.module.PREVIOUS}").LLM


@pytest.fixture(scope="module")
def Sequence(phase):  # noqa: N802
    return importlib.import_module(f"phases.{phase}.sequence").Sequence


@pytest.fixture(scope="module")
def cli(phase):
    return importlib.import_module(f"phases.{phase}.__main__")
