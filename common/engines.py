"""Engine names used by the bench harness: "p03" (a phase's LLM), or an HF baseline (HF_ENGINES)."""
from __future__ import annotations

import importlib
import re

from .results import ROOT

# HF baselines: name -> HFEngine options. "hf-generate-nocudnn" is eager generate with cuDNN's SDPA
# kernel ruled out: on H200 PyTorch picks cuDNN for masked (padded, batched) attention, and cuDNN
# builds a plan for every new key length, i.e. every decode step (see the phases' attention.py).
HF_ENGINES = {"hf-generate": {"mode": "eager"}, "hf-static": {"mode": "static"},
              "hf-generate-nocudnn": {"mode": "eager", "cudnn_attention": False}}


def phase_folder(name: str) -> str:
    """"p03" or "p03_vectorized_gather" -> "p03_vectorized_gather"."""
    m = re.fullmatch(r"(p\d\d)(_\w+)?", name)
    found = sorted((ROOT / "phases").glob(f"{m.group(1)}_*")) if m else []
    if not found:
        raise ValueError(f"unknown engine {name!r}: use a phase like 'p01' or one of {sorted(HF_ENGINES)}")
    return found[0].name


def make_engine(name: str, preset: str, device: str, dtype: str, **options):
    """Build an engine with the common generate() API; benchmarks skip detokenizing. A phase's
    engine over worker processes (options parallel="replica" | "pipeline") is its ParallelLLM; the
    engine behind its HTTP server (option server="http", phase 09 on) is its ServedLLM."""
    if name in HF_ENGINES:
        from .hf_reference import HFEngine
        return HFEngine(preset, **HF_ENGINES[name], device=device, dtype=dtype,
                        detokenize=False, **options)
    module = importlib.import_module(f"phases.{phase_folder(name)}")
    engine = module.LLM
    if options.get("server", "none") != "none":      # phase 09 on: the engine behind its HTTP server
        engine = getattr(module, "ServedLLM", None)
        if engine is None:
            raise ValueError(f"{name} has no HTTP server (phase 09 on): drop server=")
    elif options.get("parallel", "none") != "none":
        engine = getattr(module, "ParallelLLM", None)
        if engine is None:
            raise ValueError(f"{name} has no engine over worker processes: drop parallel=")
    return engine(preset, device=device, dtype=dtype, detokenize=False, **options)
