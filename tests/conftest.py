"""Shared test set-up: repo root on sys.path, one CPU thread, the lineage-aware selection of `make test`
(tests/selection.py: a suite in full where its files changed, its smoke subset elsewhere), GPU
auto-skip, and the session-wide HF reference.

Every phase's suite (tests/pNN_topic/) uses the same fixtures, so the HuggingFace greedy ids are
computed once per session per preset (see tests/reference.py) and every engine is held to them.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest
import torch

# One CPU thread per test process, and per process a test starts (OMP_NUM_THREADS is inherited).
# The tests' matrices are small: a second thread gains nothing, and `make test` runs one pytest
# worker per core, whose threads would otherwise contend for the same cores (twice the wall time).
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import reference, selection  # noqa: E402  (needs the repo root on sys.path)


def pytest_addoption(parser):
    parser.addoption(selection.OPTION, action="store_true",
                     help=f"every test in every phase (make test-all; or {selection.ENV}=1), not the lineage-aware "
                          "selection of tests/selection.py")


def pytest_collection_modifyitems(config, items):
    """Deselect what tests/selection.py says `make test` need not run again: a shared suite runs in
    full only in phases whose copy of its files changed (elsewhere its smoke subset), a
    @pytest.mark.worker_code test only where worker.py / worker_pool.py changed (server_process:
    serve.py / served.py; sampler_code: sampler.py; speculator_code: speculator.py / proposers.py /
    sampler.py; cli_paths: __main__.py's code paths), and a @pytest.mark.slow test only in make
    test-all. A @pytest.mark.fuzz_soak test runs only when asked for by name (make fuzz, pytest -m
    fuzz_soak), never in make test or make test-all. Then skip @pytest.mark.gpu tests on machines
    without CUDA (every other test runs on CPU)."""
    if not selection.soak_requested(config):
        deselect(config, items, [item.get_closest_marker(selection.SOAK) is None for item in items])
    if not selection.run_all(config):
        deselect(config, items, [selection.selected(item) for item in items])
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def deselect(config, items, keep: list[bool]) -> None:
    """Drop the items whose keep is False, reporting them as deselected."""
    if not all(keep):
        config.hook.pytest_deselected(items=[item for item, k in zip(items, keep) if not k])
        items[:] = [item for item, k in zip(items, keep) if k]


@pytest.fixture(scope="session")
def real_prompts() -> list[list[int]]:
    """The SmolLM2 prompt set as token ids (chat, plain, non-ASCII, > 512 tokens)."""
    return reference.prompts_for("smollm2-135m")


@pytest.fixture(scope="session")
def prompts_for():
    """prompts_for(preset): the reference prompt set of any preset in reference.REF_PRESETS."""
    return reference.prompts_for


@pytest.fixture(scope="session")
def hf_reference(pytestconfig):
    """hf_reference(preset): HF greedy ids (fp32 CPU, REF_NEW_TOKENS = 32 new tokens, EOS ignored) for
    prompts_for(preset), computed on first use and cached for the rest of the session; `make test`
    reads them from the file an earlier session left on the same inputs (tests/reference.py),
    `make test-all` computes them again."""
    recompute = selection.run_all(pytestconfig)
    return lambda preset: reference.hf_reference(preset, recompute)


@pytest.fixture(scope="session")
def hf_prefix(prompts_for, hf_reference):
    """hf_prefix(preset, n): prompts_for(preset) and HF's first n greedy ids for each of them."""
    return lambda preset, n: (prompts_for(preset), [ref[:n] for ref in hf_reference(preset)])


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
def previous(request) -> str:
    """The phase the phase under test is compared with (the test module's PREVIOUS)."""
    return request.module.PREVIOUS


@pytest.fixture(scope="module")
def PrevLLM(request):  # noqa: N802
    return importlib.import_module(f"phases.{request.module.PREVIOUS}").LLM


@pytest.fixture(scope="module")
def Sequence(phase):  # noqa: N802
    return importlib.import_module(f"phases.{phase}.sequence").Sequence


@pytest.fixture(scope="module")
def cli(phase):
    return importlib.import_module(f"phases.{phase}.__main__")
