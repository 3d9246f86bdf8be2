"""Turn what a user passes to generate() into validated (prompt ids, SamplingParams) pairs.

Everything is checked before any work starts, so one bad request fails the call at once with
a clear message instead of after the others have run.
"""
from __future__ import annotations

from numbers import Number
from typing import Callable, Sequence

from .sampling import SamplingParams, is_int

Prompt = str | list[int]
PROMPT_TYPES = "a str, a list of int token ids, or a list of those"


def as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """A single str or a single list of ints is one prompt; a list of those is a batch.
    Anything else (None, bytes, a dict, a numpy array or tensor, float ids) is refused here:
    list() would quietly turn bytes or a dict's keys into token ids."""
    if isinstance(prompts, str):
        return [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(f"prompts must be {PROMPT_TYPES}, got {_describe(prompts)}")
    if not prompts:
        raise ValueError("generate() needs at least one prompt")
    if all(is_int(t) for t in prompts):
        return [list(prompts)]
    if any(isinstance(t, Number) for t in prompts) and not any(isinstance(t, (str, list, tuple)) for t in prompts):
        check_prompt_type(0, prompts)       # numbers, not prompts: one prompt's ids, one not an int
    for i, prompt in enumerate(prompts):
        check_prompt_type(i, prompt)
    return [p if isinstance(p, str) else list(p) for p in prompts]


def check_prompt_type(i: int, prompt) -> None:
    """One prompt of a batch: a str, or a list/tuple of int token ids."""
    if isinstance(prompt, str):
        return
    if not isinstance(prompt, (list, tuple)):
        raise ValueError(f"request {i}: a prompt must be a str or a list of int token ids, "
                        f"got {_describe(prompt)}")
    bad = next((t for t in prompt if not is_int(t)), None)
    if bad is not None:
        raise ValueError(f"request {i}: token ids must be Python ints, got {_describe(bad)}")


def _describe(x) -> str:
    hint = " (convert it with .tolist())" if hasattr(x, "tolist") else ""
    return f"{type(x).__name__} {x!r:.40}{hint}"


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
                     max_model_len: int, detokenize: bool = True) -> list[tuple[list[int], SamplingParams]]:
    """detokenize=False: the engine never turns tokens into text, so it cannot see stop strings;
    a request that sets them is refused rather than quietly run to max_tokens."""
    prompt_list = as_prompt_list(prompts)
    params_list = as_params_list(params, len(prompt_list))
    requests = []
    for i, (prompt, p) in enumerate(zip(prompt_list, params_list)):
        ids = encode(prompt) if isinstance(prompt, str) else list(prompt)
        check_prompt(i, ids, p, vocab_size, max_model_len)
        check_stop(i, p, detokenize)
        requests.append((ids, p))
    return requests


def check_prompt(i: int, ids: list[int], p: SamplingParams, vocab_size: int, max_model_len: int) -> None:
    if not isinstance(p, SamplingParams):
        raise ValueError(f"request {i}: expected SamplingParams, got {type(p).__name__}")
    try:
        p.validate()                        # its stop list may have been changed in place
    except ValueError as e:
        raise ValueError(f"request {i}: {e}") from None
    if len(ids) == 0:
        raise ValueError(f"request {i}: the prompt is empty")
    if any(not isinstance(t, int) or not 0 <= t < vocab_size for t in ids):
        raise ValueError(f"request {i}: token ids must be ints in [0, {vocab_size})")
    if len(ids) + p.max_tokens > max_model_len:
        raise ValueError(f"request {i}: prompt ({len(ids)} tokens) + max_tokens ({p.max_tokens}) "
                         f"exceeds the context length {max_model_len}; shorten the prompt or "
                         f"lower max_tokens")


def check_stop(i: int, p: SamplingParams, detokenize: bool) -> None:
    if p.stop and not detokenize:
        raise ValueError(f"request {i}: stop strings {p.stop!r} need text, but this engine was built "
                         f"with detokenize=False; drop stop or build the engine with detokenize=True")
