"""Sampler: logits -> next token (greedy, temperature, top-k, top-p)."""
from __future__ import annotations

import torch

from common.sampling import SamplingParams, generator_seed


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """logits: (vocab,) fp32 -> (1,) token id, left on the device (the next step's input)."""
    if params.greedy:
        return logits.argmax().view(1)
    probs = torch.softmax(_filter(logits / params.temperature, params), dim=-1)
    return torch.multinomial(probs, 1, generator=generator)


def sample_batch(logits: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator | None]) -> list[int]:
    """logits: (B, vocab) fp32 -> B token ids. Greedy rows come from one argmax over the batch;
    a sampled row has its own temperature, filters and RNG, so it is drawn on its own."""
    tokens = logits.argmax(dim=-1)                         # (B,)
    for i, (p, generator) in enumerate(zip(params, generators)):
        if not p.greedy:
            tokens[i] = sample(logits[i], p, generator)[0]
    return tokens.tolist()                                 # one host sync for the whole batch


def _filter(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Set logits outside top-k and outside the top-p nucleus to -inf."""
    if params.top_k > 0:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1])).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p (the first stays).
        drop = probs.cumsum(-1) - probs >= params.top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def make_generator(params: SamplingParams, device: str) -> torch.Generator | None:
    """A private RNG for a seeded request; None uses the global RNG (seeded by the engine)."""
    if params.seed is None or params.greedy:
        return None
    return torch.Generator(device=device).manual_seed(generator_seed(params.seed))
