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
    SamplingParams(temperature=1e-5, seed=2**64 - 1, stop=None)
    SamplingParams(temperature=3, top_p=1)          # ints are numbers too


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_tokens=0), "max_tokens must be a positive integer"),
    (dict(max_tokens=-1), "max_tokens must be a positive integer"),
    (dict(max_tokens=2.5), "max_tokens must be a positive integer"),
    (dict(max_tokens=True), "max_tokens must be a positive integer"),
    (dict(temperature=-0.1), "temperature must be 0 .greedy. or a finite number >= 1e-05"),
    (dict(temperature=float("nan")), "temperature must be 0"),
    (dict(temperature=float("inf")), "temperature must be 0"),
    (dict(temperature=1e-38), "temperature must be 0"),
    (dict(temperature=9e-6), "temperature must be 0"),
    (dict(temperature="0.5"), "temperature must be 0"),
    (dict(temperature=None), "temperature must be 0"),
    (dict(temperature=True), "temperature must be 0"),
    (dict(top_p=0.0), r"top_p must be a number in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be a number in \(0, 1\]"),
    (dict(top_p=float("nan")), r"top_p must be a number in \(0, 1\]"),
    (dict(top_p=None), r"top_p must be a number in \(0, 1\]"),
    (dict(top_k="5"), "top_k must be a non-negative integer"),
    (dict(top_k=None), "top_k must be a non-negative integer"),
    (dict(stop=5), "stop must be a string or a list of non-empty strings"),
    (dict(ignore_eos="no"), "ignore_eos must be True or False"),
    (dict(seed=2**64), r"seed must be None or an integer in \[0, 2\*\*64\)"),
    (dict(seed=1.5), "seed must be None or an integer"),
    (dict(seed=True), "seed must be None or an integer"),
    (dict(top_k=-2), "top_k must be a non-negative integer"),
    (dict(top_k=1.5), "top_k must be a non-negative integer"),
    (dict(stop=[""]), "stop must be a list of non-empty strings"),
    (dict(stop=[3]), "stop must be a list of non-empty strings"),
    (dict(seed=-1), "seed must be None or an integer in"),
])
def test_rejects(kwargs, message):
    """Each invalid value raises a ValueError naming the field."""
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("name, value, message", [
    ("temperature", float("nan"), "temperature must be 0"),
    ("max_tokens", -1, "max_tokens must be a positive integer"),
    ("top_p", 0.0, r"top_p must be a number in \(0, 1\]"),
    ("seed", 2**64, "seed must be None or an integer"),
    ("stop", [""], "stop must be a list of non-empty strings"),
])
def test_rejects_a_change_after_construction(name, value, message):
    """A field set after construction is checked like one passed to it, and the bad value is not
    taken (temperature=nan would otherwise fail inside the sampler, mid-run)."""
    p = SamplingParams()
    before = getattr(p, name)
    with pytest.raises(ValueError, match=message):
        setattr(p, name, value)
    assert getattr(p, name) == before


def test_a_change_after_construction_is_normalized():
    """A good value set later is taken, normalized as at construction."""
    p = SamplingParams()
    p.stop, p.top_k, p.temperature = "###", -1, 0
    assert p.stop == ["###"] and p.top_k == 0 and p.greedy


def test_generator_seeds_stay_distinct():
    """torch's CPU generator keeps 32 bits of its seed: 0, 2**32 and 2**63 would share one stream.
    Seeds below 2**32 pass unchanged; larger ones are hashed from all their bits into that range."""
    from common.sampling import generator_seed
    seeds = [0, 1, 2**32, 2**32 + 1, 2**63, 2**64 - 1]
    derived = [generator_seed(s) for s in seeds]
    assert derived[:2] == [0, 1] and len(set(derived)) == len(seeds)
    assert all(0 <= d < 2**32 for d in derived)
