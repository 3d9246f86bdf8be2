"""The config fuzzer's oracle itself (tests/suites/config_fuzz.py): where it lets a request's tokens
leave those it gets alone, and where it must not."""
import torch

from tests.suites import config_fuzz as fuzz


def alone_with(quantization, prompt, tokens, logits_per_step) -> fuzz.Alone:
    """An oracle that already ran `prompt` alone: its tokens, and each step's logits over 40 ids."""
    alone = object.__new__(fuzz.Alone)          # no engine: the answers are given
    key = (quantization, *prompt)
    alone.answers = {key: tokens}
    alone.top = {key: [torch.tensor(step).topk(fuzz.TIE_TOP_K) for step in logits_per_step]}
    return alone


def logits(scores: dict[int, float]) -> list[float]:
    row = [0.0] * 40
    for token, score in scores.items():
        row[token] = score
    return row


def test_fp8_may_leave_its_alone_tokens_only_at_a_near_tie():
    steps = [logits({7: 4.0, 8: 3.9}), logits({9: 4.0, 10: 3.99, 11: 3.0}), logits({12: 4.0})]
    alone = alone_with("fp8", [1, 2], [7, 9, 12], steps)
    assert alone.near_tie([1, 2], [7, 10, 30], "fp8")        # 10 within 0.01 of the top; then unjudged
    assert not alone.near_tie([1, 2], [7, 11, 12], "fp8")    # 11 is 1.0 below it: a bug, not a tie
    assert not alone.near_tie([1, 2], [7, 39, 12], "fp8")    # 39 is 4.0 below
    assert not alone.near_tie([1, 2], [7, 9], "fp8")         # shorter, no differing step: not a tie
    assert alone.near_tie([1, 2], [8, 3, 3], "fp8")          # 8 is 0.1 below the top at the first step


def test_float_and_int8_are_held_to_every_token():
    steps = [logits({7: 4.0, 8: 3.99999})]
    for quantization in (None, "w8a8", "w8a8-nosmooth"):
        alone = alone_with(quantization, [1], [7], steps)
        assert not alone.near_tie([1], [8], quantization)
