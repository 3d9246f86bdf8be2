"""Turn what a user passes to generate() into validated (prompt ids, SamplingParams) pairs.

Everything is checked before any work starts, so one bad request fails the call at once with
a clear message instead of after the others have run.
"""
from __future__ import annotations

from typing import Callable, Sequence

from .sampling import SamplingParams

Prompt = str | list[int]


def as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """A single str or a single list of ints is one prompt; a list of those is a batch."""
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]
    if not prompts:
        raise ValueError("generate() needs at least one prompt")
    return prompts


def as_params_list(params: SamplingParams | Sequence[SamplingParams] | None, n: int) -> list[SamplingParams]:
    if params is None:
        params = SamplingParams()
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise ValueError(f"got {len(params)} SamplingParams for {n} prompts")
    return params


def prepare_requests(prompts, params, encode: Callable[[str], list[int]], vocab_size: int,
                     max_model_len: int) -> list[tuple[list[int], SamplingParams]]:
    prompt_list = as_prompt_list(prompts)
    params_list = as_params_list(params, len(prompt_list))
    requests = []
    for i, (prompt, p) in enumerate(zip(prompt_list, params_list)):
        ids = encode(prompt) if isinstance(prompt, str) else list(prompt)
        check_prompt(i, ids, p, vocab_size, max_model_len)
        requests.append((ids, p))
    return requests


def check_prompt(i: int, ids: list[int], p: SamplingParams, vocab_size: int, max_model_len: int) -> None:
    if not isinstance(p, SamplingParams):
        raise TypeError(f"request {i}: expected SamplingParams, got {type(p).__name__}")
    if len(ids) == 0:
        raise ValueError(f"request {i}: the prompt is empty")
    if any(not isinstance(t, int) or not 0 <= t < vocab_size for t in ids):
        raise ValueError(f"request {i}: token ids must be ints in [0, {vocab_size})")
    if len(ids) + p.max_tokens > max_model_len:
        raise ValueError(f"request {i}: prompt ({len(ids)} tokens) + max_tokens ({p.max_tokens}) "
                         f"exceeds the context length {max_model_len}; shorten the prompt or "
                         f"lower max_tokens")
