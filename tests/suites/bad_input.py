"""Bad input fails at once with a clear ValueError, does no work, and leaves the engine usable."""
import re

import pytest
import torch

from common.sampling import SamplingParams


MAX_LEN = 64
OK = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(LLM):
    return LLM("tiny-llama", device="cpu", dtype="float32", max_model_len=MAX_LEN)


class ForwardCounter:
    """Counts nn.Module forward calls anywhere in this process while active."""

    def __enter__(self):
        self.calls = 0
        self._handle = torch.nn.modules.module.register_module_forward_hook(self._hook)
        return self

    def _hook(self, *args):
        self.calls += 1

    def __exit__(self, *exc):
        self._handle.remove()


def test_empty_string_prompt(llm):
    """An empty text prompt (no tokens) is rejected."""
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate([""], OK)


def test_empty_id_list(llm):
    """An empty token-id list is rejected, alone or inside a batch."""
    with pytest.raises(ValueError, match="at least one prompt"):
        llm.generate([], OK)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate([[1, 2, 3], []], OK)


def test_prompt_plus_max_tokens_over_context(llm):
    """prompt + max_tokens > max_model_len is rejected with both numbers; exactly equal is fine."""
    with pytest.raises(ValueError, match=r"prompt \(60 tokens\) \+ max_tokens \(5\) exceeds the context length 64"):
        llm.generate([list(range(1, 61))], SamplingParams(temperature=0, max_tokens=5))
    out = llm.generate([list(range(1, 61))], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert len(out.token_ids) == 4


def test_max_model_len_over_model_limit(LLM):
    """An engine cannot be configured past the model's max_position_embeddings."""
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings 2048"):
        LLM("tiny-llama", device="cpu", dtype="float32", max_model_len=4096)


@pytest.mark.parametrize("max_tokens", [0, -1])
def test_max_tokens_not_positive(max_tokens):
    """max_tokens <= 0 is rejected when the SamplingParams is built."""
    with pytest.raises(ValueError, match="max_tokens must be a positive integer"):
        SamplingParams(max_tokens=max_tokens)


def test_unknown_preset(LLM):
    """An unknown model name lists the presets in its message."""
    with pytest.raises(ValueError, match="unknown model 'no-such-model'") as err:
        LLM("no-such-model", device="cpu")
    assert "tiny-llama" in str(err.value) and "smollm2-135m" in str(err.value)


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-1.0), "temperature must be 0 .greedy. or a finite number >= 1e-05"),
    (dict(temperature=float("nan")), "temperature must be 0"),
    (dict(temperature=1e-38), "temperature must be 0"),         # logits / 1e-38 overflow to inf
    (dict(temperature="0.7"), "temperature must be 0"),         # was a TypeError from a comparison
    (dict(temperature=None), "temperature must be 0"),
    (dict(top_p=0.0), r"top_p must be a number in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be a number in \(0, 1\]"),
    (dict(top_p="1"), r"top_p must be a number in \(0, 1\]"),
    (dict(top_k=-2), "top_k must be a non-negative integer"),
    (dict(seed=2**64), r"seed must be None or an integer in \[0, 2\*\*64\)"),   # Generator overflow
])
def test_bad_sampling_values(llm, kwargs, message):
    """Out-of-range or mistyped sampling values are rejected before any request is made."""
    with pytest.raises(ValueError, match=message):
        llm.generate([[1, 2, 3]], SamplingParams(**kwargs))


@pytest.mark.parametrize("kwargs", [dict(temperature=1e-5, seed=1), dict(temperature=1e30, seed=1),
                                    dict(temperature=1.0, seed=2**64 - 1)])
def test_sampling_range_edges_run(llm, kwargs):
    """The edges of the accepted ranges run to the end and give real tokens."""
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True, **kwargs))[0]
    assert len(out.token_ids) == 4


@pytest.mark.parametrize("prompts, message", [
    (None, "prompts must be a str, a list of int token ids, or a list of those, got NoneType"),
    (b"hello", "prompts must be .*got bytes"),                  # list(b"..") would be ids 104, ...
    ({1: "a", 2: "b"}, "prompts must be .*got dict"),           # list(dict) would be its keys
    (torch.tensor([1, 2, 3]), r"got Tensor .*\.tolist\(\)"),
    ([1.0, 2.0, 3.0], "request 0: token ids must be Python ints, got float 1.0"),
    ([1, 2.0, 3], "request 0: token ids must be Python ints, got float 2.0"),    # not "got int 1"
    ([[1, 2.0, 3]], "request 0: token ids must be Python ints, got float"),
    ([[1, 2], b"hi"], "request 1: a prompt must be .*got bytes"),
    ([[1, 2], None], "request 1: a prompt must be .*got NoneType"),
    ([[True, 2]], "request 0: token ids must be Python ints, got bool"),
])
def test_bad_prompt_types(llm, prompts, message):
    """A prompt is a str or a list of int ids; anything else is one clear ValueError."""
    with pytest.raises(ValueError, match=message):
        llm.generate(prompts, OK)


@pytest.mark.parametrize("name, value, message", [
    ("temperature", float("nan"), "temperature must be 0"),
    ("max_tokens", -1, "max_tokens must be a positive integer"),
])
def test_sampling_params_changed_later_are_checked(llm, name, value, message):
    """A SamplingParams changed after construction is checked too: the bad value is refused
    where it is set, and the engine still gets the good one."""
    params = SamplingParams(temperature=0.5, max_tokens=4, ignore_eos=True, seed=1)
    with pytest.raises(ValueError, match=message):
        setattr(params, name, value)
    assert len(llm.generate([[1, 2, 3]], params)[0].token_ids) == 4


def test_stop_list_changed_in_place_is_checked(llm):
    """The one change no setter sees, a stop list edited in place, is checked as the engine
    takes the request."""
    params = SamplingParams(max_tokens=4, stop=["x"])
    params.stop.append("")
    with pytest.raises(ValueError, match="request 0: stop must be a list of non-empty strings"):
        llm.generate([[1, 2, 3]], params)


def test_numpy_prompt_is_refused(llm):
    np = pytest.importorskip("numpy")
    with pytest.raises(ValueError, match=r"got ndarray .*\.tolist\(\)"):
        llm.generate(np.array([1, 2, 3]), OK)
    with pytest.raises(ValueError, match=r"request 0: a prompt must be .*got ndarray"):
        llm.generate([np.array([1, 2, 3])], OK)


def test_tuple_prompt_is_ids(llm):
    """A tuple of ints is a prompt like a list of ints."""
    assert llm.generate((5, 6, 7), OK)[0].token_ids == llm.generate([5, 6, 7], OK)[0].token_ids


def test_stop_strings_need_detokenize(LLM):
    """An engine that never makes text cannot see stop strings: refused, not ignored."""
    llm = LLM("tiny-llama", device="cpu", dtype="float32", max_model_len=MAX_LEN, detokenize=False)
    with pytest.raises(ValueError, match="request 0: stop strings .* need text.*detokenize=False"):
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, stop=["a"]))
    assert len(llm.generate([[1, 2, 3]], OK)[0].token_ids) == 4


@pytest.mark.parametrize("device", ["gpu", "GPU", "cuda0", "mps", "cpu:0"])
def test_unknown_device(LLM, device):
    with pytest.raises(ValueError, match=f"unknown device '{device}'; use 'cpu', 'cuda' or 'cuda:N'"):
        LLM("tiny-llama", device=device)


def test_token_id_out_of_vocab(llm):
    """Token ids outside [0, vocab) are rejected (both ends)."""
    vocab = llm.model_config.vocab_size
    for bad in (vocab, -1):
        with pytest.raises(ValueError, match=re.escape(f"token ids must be ints in [0, {vocab})")):
            llm.generate([[1, bad, 3]], OK)


def test_mismatched_sampling_params(llm):
    """A list of SamplingParams must have one entry per prompt."""
    with pytest.raises(ValueError, match="got 1 SamplingParams for 2 prompts"):
        llm.generate([[1, 2], [3, 4]], [OK])


def test_bad_request_in_batch_does_no_work(llm):
    """A batch whose last request is bad fails before any forward pass, names the request,
    and the engine then serves good requests unchanged."""
    good = [5, 6, 7, 8]
    before = llm.generate([good], OK)[0]
    with ForwardCounter() as counter:
        with pytest.raises(ValueError, match="request 2: the prompt is empty"):
            llm.generate([good, good, []], OK)
    assert counter.calls == 0
    with ForwardCounter() as counter:
        after = llm.generate([good], OK)[0]
    assert counter.calls > 0          # the counter does see real work
    assert after.token_ids == before.token_ids
