"""SamplingParams: defaults, normalization and validation."""
import pytest

from common.sampling import SamplingParams


def test_defaults():
    """Defaults are vLLM's: temperature 1, no top-k/top-p filter, 256 tokens, EOS honoured."""
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens) == (1.0, 1.0, 0, 256)
    assert p.stop == [] and p.ignore_eos is False and p.seed is None
    assert not p.greedy


def test_greedy_flag():
    """temperature 0 means greedy."""
    assert SamplingParams(temperature=0).greedy
    assert not SamplingParams(temperature=0.01).greedy


def test_normalization():
    """A single stop string becomes a list and top_k=-1 means 'off' (0)."""
    p = SamplingParams(stop="###", top_k=-1)
    assert p.stop == ["###"] and p.top_k == 0
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]


def test_valid_edges():
    """The edges of each valid range are accepted."""
    SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_tokens=1, seed=0)
    SamplingParams(top_p=1e-9, top_k=1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_tokens=0), "max_tokens must be a positive integer"),
    (dict(max_tokens=-1), "max_tokens must be a positive integer"),
    (dict(max_tokens=2.5), "max_tokens must be a positive integer"),
    (dict(max_tokens=True), "max_tokens must be a positive integer"),
    (dict(temperature=-0.1), "temperature must be >= 0"),
    (dict(temperature=float("nan")), "temperature must be >= 0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(top_k=-2), "top_k must be a non-negative integer"),
    (dict(top_k=1.5), "top_k must be a non-negative integer"),
    (dict(stop=[""]), "stop must be a list of non-empty strings"),
    (dict(stop=[3]), "stop must be a list of non-empty strings"),
    (dict(seed=-1), "seed must be a non-negative integer"),
])
def test_rejects(kwargs, message):
    """Each invalid value raises a ValueError naming the field."""
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
