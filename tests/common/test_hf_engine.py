"""HFEngine, the transformers baseline: batched greedy equals the per-prompt reference."""
import pytest

from common.hf_reference import HFEngine
from common.sampling import SamplingParams
from tests.reference import RANDOM_PROMPT_LENS, REF_NEW_TOKENS

SAME_LEN = [i for i, n in enumerate(RANDOM_PROMPT_LENS) if RANDOM_PROMPT_LENS.count(n) == 2]


@pytest.fixture(scope="module")
def engine():
    return HFEngine("tiny-llama", device="cpu", dtype="float32", batch_size=2)


def test_batched_greedy_equals_reference(engine, prompts_for, hf_reference):
    """Two same-length prompts in one batch (no padding) give hf_greedy's ids for each prompt."""
    assert len(SAME_LEN) == 2
    prompts = [prompts_for("tiny-llama")[i] for i in SAME_LEN]
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=REF_NEW_TOKENS, ignore_eos=True))
    ref = hf_reference("tiny-llama")
    for i, out in zip(SAME_LEN, outs, strict=True):
        assert out.token_ids == ref[i]
        assert out.prompt_token_ids == prompts_for("tiny-llama")[i]
        assert out.finish_reason == "length"


def test_token_times(engine, prompts_for):
    """One non-decreasing timestamp per generated token, all after arrival."""
    outs = engine.generate(prompts_for("tiny-llama")[:3], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    for out in outs:
        assert len(out.token_times) == len(out.token_ids) == 12
        assert all(a <= b for a, b in zip(out.token_times, out.token_times[1:]))
        assert out.ttft > 0


def test_eos_stops_real_model(tokenizer):
    """With EOS active the baseline stops at EOS (finish 'stop') and answers Paris."""
    hf = HFEngine("smollm2-135m", device="cpu", dtype="float32")
    out = hf.generate([tokenizer.chat_ids("What is the capital of France?")],
                      SamplingParams(temperature=0, max_tokens=48))[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == tokenizer.eos_token_id
    assert "Paris" in out.text


def test_rejects_stop_strings(engine):
    """The baseline refuses stop strings instead of silently ignoring them."""
    with pytest.raises(ValueError, match="no stop strings"):
        engine.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4, stop=["x"]))


def test_requests_of_one_call_arrive_together(engine, prompts_for):
    """As in the engines, every request of a generate() call arrives when the call starts: the
    second batch's wait for the first counts in its time to first token."""
    outs = engine.generate(prompts_for("tiny-llama")[:4], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len({out.arrival_time for out in outs}) == 1
    assert outs[2].ttft > outs[1].token_times[-1] - outs[1].arrival_time
