"""Sampling: seeds, top-k/top-p, stop strings, max_tokens and ignore_eos."""

import pytest

from common.sampling import SamplingParams


@pytest.fixture(scope="module")
def llm(LLM):
    return LLM("tiny-llama", device="cpu", dtype="float32", seed=0)


@pytest.fixture(scope="module")
def prompt(prompts_for):
    return prompts_for("tiny-llama")[1]


def _sample(llm, prompt, **kw):
    return llm.generate([prompt], SamplingParams(**kw))[0]


def test_same_seed_same_tokens(llm, prompt):
    """Two runs with the same seed (temperature 0.8, top_p 0.9) produce the same tokens."""
    a = _sample(llm, prompt, temperature=0.8, top_p=0.9, max_tokens=32, seed=7)
    b = _sample(llm, prompt, temperature=0.8, top_p=0.9, max_tokens=32, seed=7)
    assert a.token_ids == b.token_ids
    assert len(a.token_ids) == 32


def test_different_seeds_differ(llm, prompt):
    """Different seeds give different samples (32 high-entropy tokens from a random model)."""
    a = _sample(llm, prompt, temperature=0.8, top_p=0.9, max_tokens=32, seed=1)
    b = _sample(llm, prompt, temperature=0.8, top_p=0.9, max_tokens=32, seed=2)
    assert a.token_ids != b.token_ids


def test_seeds_apart_by_2_pow_32_differ(llm, prompt):
    """0, 2**32 and 2**63 are three seeds, not one: torch's CPU generator keeps only 32 bits of
    its seed, so the engine derives that from all 64."""
    samples = [_sample(llm, prompt, temperature=0.8, max_tokens=16, seed=s).token_ids for s in (0, 2**32, 2**63)]
    assert len({tuple(t) for t in samples}) == 3


def test_seeded_request_ignores_batch_neighbours(llm, prompts_for, prompt):
    """A seeded request samples the same tokens alone and next to other sampled requests."""
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=3)
    alone = llm.generate([prompt], params)[0]
    others = SamplingParams(temperature=1.0, max_tokens=16)
    batch = llm.generate([prompts_for("tiny-llama")[0], prompt], [others, params])
    assert batch[1].token_ids == alone.token_ids


def test_top_k_1_is_greedy(llm, prompt):
    """top_k=1 at temperature 1.0 keeps only the argmax, so it reproduces greedy decoding."""
    greedy = _sample(llm, prompt, temperature=0, max_tokens=32)
    top1 = _sample(llm, prompt, temperature=1.0, top_k=1, max_tokens=32, seed=5)
    assert top1.token_ids == greedy.token_ids


def test_tiny_top_p_is_greedy(llm, prompt):
    """A nucleus smaller than the top token's probability keeps only that token (= greedy)."""
    greedy = _sample(llm, prompt, temperature=0, max_tokens=32)
    nucleus = _sample(llm, prompt, temperature=1.0, top_p=1e-6, max_tokens=32, seed=5)
    assert nucleus.token_ids == greedy.token_ids


def test_stop_string(llm, prompt):
    """Generation ends at a stop string taken from the greedy text; the text excludes it."""
    full = _sample(llm, prompt, temperature=0, max_tokens=32)
    words = full.text.split()
    stop = words[len(words) // 2]
    out = _sample(llm, prompt, temperature=0, max_tokens=32, stop=[stop])
    assert out.finish_reason == "stop"
    assert stop not in out.text
    assert full.text.startswith(out.text)
    assert len(out.token_ids) < 32


def test_max_tokens(llm, prompt):
    """Exactly max_tokens tokens come back when nothing else stops the request."""
    for n in (1, 7):
        out = _sample(llm, prompt, temperature=0, max_tokens=n, ignore_eos=True)
        assert len(out.token_ids) == n
        assert out.finish_reason == "length"


def test_ignore_eos(llm, prompt, monkeypatch):
    """ignore_eos keeps generating past EOS up to max_tokens; without it, EOS ends the request.
    The EOS is a token of tiny-llama's greedy answer, made the model's EOS for this test (the
    engine reads its EOS ids from the model's config): a real model's EOS takes the same path, and
    the correctness suite has the real model answer and stop on its own EOS."""
    greedy = _sample(llm, prompt, temperature=0, max_tokens=12, ignore_eos=True).token_ids
    end = next(i for i in range(4, 12) if greedy[i] not in greedy[:i])    # its first occurrence
    monkeypatch.setattr(llm.source.fields, "eos_token_id", greedy[end])
    stopped = _sample(llm, prompt, temperature=0, max_tokens=12)
    assert stopped.finish_reason == "stop" and stopped.token_ids == greedy[:end + 1]
    ignored = _sample(llm, prompt, temperature=0, max_tokens=12, ignore_eos=True)
    assert ignored.finish_reason == "length" and ignored.token_ids == greedy
