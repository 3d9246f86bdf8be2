"""A replayed decode step against the same step run eagerly, for the GPU tests of the phases
whose kernels run inside CUDA graphs (p15's split-K decode, p17's latent decode)."""
from __future__ import annotations

import torch

from common.sampling import SamplingParams


def replay_matches_eager(llm, prompt_len: int = 6000) -> bool:
    """Prefill one request of `prompt_len` tokens, then plan its first decode step: the graph's
    replay and the eager forward on the same static buffers give the same logits, bit for bit."""
    graphs = llm.runner.graphs
    llm.add_request(list(range(1, prompt_len + 1)), SamplingParams(max_tokens=3, temperature=0.0))
    while llm.scheduler.waiting or any(s.num_pending_tokens > 1 for s in llm.scheduler.running):
        llm.step()
    replayed = graphs.run(llm.scheduler.schedule()).clone()
    return torch.equal(replayed, graphs._forward(1)[:1])
