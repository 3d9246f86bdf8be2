"""Greedy exact match against HuggingFace, EOS handling and per-token timestamps.

`make test` runs all of it where a phase changes the files that compute the tokens
(tests/selection.py), and elsewhere test_real_model_matches_hf_prefix: the real model on the
whole reference prompt set in one batch, held to HF's first greedy ids."""

import pytest

from common.sampling import SamplingParams
from tests.reference import CAPITAL_QUESTION, REF_NEW_TOKENS, real_pool


GREEDY = SamplingParams(temperature=0, max_tokens=REF_NEW_TOKENS, ignore_eos=True)
PREFIX_TOKENS = 16              # the smoke's greedy ids per prompt: HF's reference, cut to its first 16


@pytest.fixture(scope="module")
def engines(LLM, phase):
    """engines(preset): one fp32 CPU engine per preset, built on first use, kept for the module."""
    cache = {}

    def get(preset):
        if preset not in cache:
            cache[preset] = LLM(preset, device="cpu", dtype="float32", seed=0, **real_pool(phase, preset))
        return cache[preset]
    return get


def _first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@pytest.mark.parametrize("preset", ["smollm2-135m", "tiny-llama", "tiny-qwen2"])
def test_greedy_matches_hf(engines, prompts_for, hf_reference, preset):
    """Greedy ids equal HF generate's for every reference prompt (incl. > 512 tokens, EOS ignored)."""
    outs = engines(preset).generate(prompts_for(preset), GREEDY)
    for i, (out, ref) in enumerate(zip(outs, hf_reference(preset), strict=True)):
        assert len(ref) == REF_NEW_TOKENS
        assert out.token_ids == ref, f"prompt {i}: first difference at token {_first_diff(out.token_ids, ref)}"
        assert out.finish_reason == "length"


def test_real_model_matches_hf_prefix(engines, prompts_for, hf_reference):
    """SmolLM2's reference prompts (chat, plain, non-ASCII, > 512 tokens) in one batch: the first
    PREFIX_TOKENS greedy ids are HF's (greedy ids do not depend on how many follow them)."""
    params = SamplingParams(temperature=0, max_tokens=PREFIX_TOKENS, ignore_eos=True)
    outs = engines("smollm2-135m").generate(prompts_for("smollm2-135m"), params)
    for i, (out, ref) in enumerate(zip(outs, hf_reference("smollm2-135m"), strict=True)):
        assert out.token_ids == ref[:PREFIX_TOKENS], \
            f"prompt {i}: first difference at token {_first_diff(out.token_ids, ref)}"


def test_chat_answer_stops_at_eos(engines, tokenizer):
    """With EOS active the real model answers the capital question with Paris and stops on EOS."""
    llm = engines("smollm2-135m")
    out = llm.generate([tokenizer.chat_ids(CAPITAL_QUESTION)], SamplingParams(temperature=0, max_tokens=64))[0]
    assert "Paris" in out.text
    assert out.finish_reason == "stop"
    assert out.token_ids[-1] == tokenizer.eos_token_id
    assert len(out.token_ids) < 64


def test_string_prompt_equals_its_ids(engines, tokenizer):
    """A text prompt is tokenized exactly like tokenizer.encode and generates the same ids (on
    tiny-llama, which shares SmolLM2's tokenizer: the weights play no part in this check)."""
    llm, text = engines("tiny-llama"), "The three primary colors are"
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    by_text, by_ids = llm.generate([text, tokenizer.encode(text)], params)
    assert by_text.prompt_token_ids == tokenizer.encode(text)
    assert by_text.token_ids == by_ids.token_ids
    assert by_text.text == tokenizer.decode(by_text.token_ids)


def test_token_times(engines, prompts_for):
    """One timestamp per token, non-decreasing, after arrival (ttft > 0); outputs keep order."""
    prompts = prompts_for("tiny-llama")
    outs = engines("tiny-llama").generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.prompt_token_ids == prompt
        assert len(out.token_times) == len(out.token_ids) == 16
        assert all(a <= b for a, b in zip(out.token_times, out.token_times[1:]))
        assert out.ttft > 0
        assert all(x >= 0 for x in out.itl)

