"""The sync count on CPU: CUDA's sync debug mode needs a GPU, so a fake engine issues the warnings
that mode would, from a "library" frame and from an "engine" frame; the count must give each its
site and its caller, per counted step, and skip the warm-up steps."""
import warnings

import torch

from common import sync_count

SYNC = "called a synchronizing CUDA operation"


def library_call():          # stands in for a kernel library that syncs through PyTorch
    warnings.warn(SYNC)


class FakeEngine:
    """Prefills in one step, then every decode step syncs once (the sampler's fetch); the third
    step after the prefill also syncs inside a library call."""

    def __init__(self):
        self.scheduler = type("Scheduler", (), {"waiting": []})()
        self.decode_steps = 0
        self.left = 0

    def add_request(self, ids, params):
        self.scheduler.waiting.append(ids)
        self.left = params.max_tokens

    def step(self):
        if self.scheduler.waiting:
            self.scheduler.waiting.clear()
            return
        self.decode_steps += 1
        self.left -= 1
        if self.decode_steps == 3:
            library_call()
        warnings.warn(SYNC)                  # the sampler's fetch: this file is the caller

    def has_unfinished(self):
        return self.left > 0


def test_syncs_are_counted_per_step_with_site_and_caller(monkeypatch):
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    engine = FakeEngine()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                   # the warm-up's and the last steps' warnings
        m = sync_count.syncs_per_step(engine, batch=2, warmup=2, steps=4)
    assert m["syncs_per_step"] == 5 / 4                  # 4 fetches, 1 library sync in step 3
    here = "tests/common/test_sync_count.py"
    assert sum(m["sync_sites"].values()) == sum(m["sync_callers"].values()) == 5
    assert all(site.startswith(here) for site in m["sync_sites"])
    assert len(m["sync_sites"]) == 2                      # two lines issued them
    assert not engine.has_unfinished()                    # the requests ran to their end


def test_caller_skips_pytorch_frames():
    frames = [("/app/phases/p06/engine.py", 10), ("/site/flash_attn/cute/interface.py", 99),
              ("/site/torch/cuda/__init__.py", 1270), ("/usr/lib/python3.12/warnings.py", 5)]
    stack = [type("Frame", (), {"filename": f, "lineno": n})() for f, n in frames]
    assert sync_count.caller(stack) == "flash_attn/cute/interface.py:99"
    assert sync_count.short_path("/a/b/torch/cuda/__init__.py") == "torch/cuda/__init__.py"
