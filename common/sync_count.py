"""Host-device synchronizations per decode step, counted by CUDA itself (a GPU bench part).

torch.cuda.set_sync_debug_mode("warn") makes every synchronizing CUDA call warn, from the Python
line that made it. The count runs decode steps under that mode and records, over all the counted
steps, each sync's site (that line, often inside PyTorch, e.g. torch/cuda/__init__.py) and its
caller: the first frame outside PyTorch on the stack, which names who asked for the sync (the
engine's sampler, or a kernel library). The first decode steps run before counting, so that a
library's one-time set-up is not counted as part of the step.
"""
from __future__ import annotations

import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch

from .sampling import SamplingParams

WARMUP, STEPS = 2, 16
PROMPT_LEN = 64
# Frames that are the machinery, not the caller: PyTorch itself and the warnings module.
MACHINERY = ("/torch/", "/warnings.py")


def syncs_per_step(llm, batch: int, warmup: int = WARMUP, steps: int = STEPS) -> dict:
    """`batch` requests of PROMPT_LEN tokens, prefilled, `warmup` decode steps, then `steps`
    counted ones. Returns the metrics of a record: syncs per step, {site: count}, {caller: count}."""
    params = SamplingParams(temperature=0, max_tokens=warmup + steps + 4, ignore_eos=True)
    for i in range(batch):
        llm.add_request(list(range(100 + i, 100 + PROMPT_LEN + i)), params)
    while llm.scheduler.waiting:
        llm.step()                                                  # prefill
    for _ in range(warmup):
        llm.step()
    syncs = counted(llm.step, steps)
    while llm.has_unfinished():
        llm.step()
    return {"syncs_per_step": len(syncs) / steps, "sync_sites": dict(Counter(site for site, _ in syncs)),
            "sync_callers": dict(Counter(caller for _, caller in syncs))}


def counted(step, steps: int) -> list[tuple[str, str]]:
    """Run step() `steps` times in sync debug mode: (site, caller) of every sync warning."""
    syncs = []

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            syncs.append((f"{short_path(filename)}:{lineno}", caller(traceback.extract_stack()[:-1])))
    with warnings.catch_warnings():                     # restores showwarning and the filters on exit
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return syncs


def caller(stack: list[traceback.FrameSummary]) -> str:
    """The innermost frame outside PyTorch and the warnings module, as "path:line"."""
    for frame in reversed(stack):
        if not any(part in frame.filename.replace("\\", "/") for part in MACHINERY):
            return f"{short_path(frame.filename)}:{frame.lineno}"
    return "?"


def short_path(filename: str) -> str:
    """The file's last three path parts, enough to name its package: "torch/cuda/__init__.py"."""
    return "/".join(Path(filename).parts[-3:])
