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


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(n, vocab) fp32 logits -> (n, vocab): the distribution sample() draws each row from."""
    return torch.stack([torch.softmax(_filter(row / params.temperature, params), dim=-1) for row in logits])


def verify(logits: torch.Tensor, drafts: list[int], draft_probs: torch.Tensor | None, params: SamplingParams,
           generator: torch.Generator | None) -> list[int]:
    """Rejection sampling (Leviathan et al. 2023, Chen et al. 2023) of one sequence's drafts.

    logits (k + 1, vocab): row j is the target's prediction for the position of draft j (row k:
    the one after the last draft). draft_probs (k, vocab): the distributions q the drafts were
    drawn from, or None for a proposer that drafts deterministically (q is one-hot on the draft).
    Draft j is kept with probability min(1, p(x) / q(x)); the first one refused is replaced by a
    draw from max(p - q, 0), renormalized; if every draft stands, row k gives one more token.
    Returns the kept drafts and that one token: each is distributed as the target's own sample."""
    p = probs(logits, params)
    for j, x in enumerate(drafts):
        q = draft_probs[j] if draft_probs is not None else torch.nn.functional.one_hot(
            torch.tensor(x, device=p.device), p.shape[-1]).to(p.dtype)
        u = torch.rand((), generator=generator, device=p.device)
        if (u * q[x] < p[j, x]).item():                       # u < p(x) / q(x), without dividing by 0
            continue
        residual = (p[j] - q).clamp_(min=0)
        residual = residual if residual.sum() > 0 else p[j]   # p == q (to rounding): nothing was refused
        return drafts[:j] + torch.multinomial(residual, 1, generator=generator).tolist()
    return drafts + torch.multinomial(p[-1], 1, generator=generator).tolist()


def verify_greedy(target: list[int], drafts: list[int]) -> list[int]:
    """target (k + 1,): the target's argmax per row. The drafts that agree with it, up to the
    first that does not, then the target's own token there (or after the last draft)."""
    agree = next((j for j, (t, x) in enumerate(zip(target, drafts)) if t != x), len(drafts))
    return target[:agree + 1]
