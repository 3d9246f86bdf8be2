"""p05_decode_profiling: the profile mode (the shared suite tests/suites/profile.py), and the
two fixes its first profile paid for, switched by lean_step (this phase's ablation switch)."""
import importlib

import torch

from common.sampling import SamplingParams
from tests.suites.profile import *  # noqa: F401,F403 - its tests and fixtures, collected here
from tests.suites.profile import OPTIONS

PHASE = "p05_decode_profiling"
LLM = importlib.import_module(f"phases.{PHASE}").LLM


def test_lean_step_changes_launches_not_tokens(prompts_for):
    """The two fixes (fused RMSNorm, additive key mask made once per step) are exact rewrites:
    in fp32 the same tokens with lean_step on and off, and the mask they hand SDPA is additive."""
    prompts = prompts_for("tiny-llama")[:3]
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0.8, top_k=20, max_tokens=9, seed=3, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)]
    lean, plain = LLM("tiny-llama", **OPTIONS), LLM("tiny-llama", **OPTIONS, lean_step=False)
    assert [o.token_ids for o in lean.generate(prompts, params)] == \
           [o.token_ids for o in plain.generate(prompts, params)]
    masks = {}
    for name, llm in (("lean", lean), ("plain", plain)):
        llm.add_request(prompts[0], params[0])
        llm.step()                                          # prefill; the next step decodes
        _, step = llm.runner.prepare_decode(llm.scheduler.running)
        masks[name] = step.key_mask
        while llm.has_unfinished():
            llm.step()
    assert masks["plain"].dtype == torch.bool and masks["lean"].dtype == torch.float32
    assert torch.equal(masks["lean"] == 0, masks["plain"])
