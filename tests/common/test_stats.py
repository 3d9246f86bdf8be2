"""common.stats: the A/A rule. A ratio is a gain or a loss only beyond the A/A range of its run."""
from common import stats


def ratio(median, lo, hi, pairs=3):
    return {"median": median, "min": lo, "max": hi, "pairs": pairs}


def rec(engine, run_id, values):
    return {"engine": engine, "run_id": run_id, "samples": [{"repeat": i, "output_tok_s": v} for i, v in enumerate(values)]}


def test_old_rule_gain_is_noise_against_the_aa_range():
    """p07 1.12x (1.03-1.24) beside an A/A pair of 0.88-1.12 in the same run: the old rule called
    it a gain, the new one calls it noise (its range does not clear the A/A's max)."""
    base, twin, new = rec("p06", "r", [100, 100, 100]), rec("p06#2", "r", [88, 112, 100]), rec("p07", "r", [103, 124, 112])
    r, aa = stats.paired_ratio(new, base, "output_tok_s"), stats.paired_ratio(twin, base, "output_tok_s")
    assert stats.verdict(r) == "gain" and not stats.within_noise(r)          # the old rule
    assert stats.verdict(r, aa) == "noise" and stats.within_noise(r, aa)     # the new rule
    assert stats.format_ratio(r, aa) == "1.12× (1.03–1.24) noise; A/A 0.88–1.12"
    assert stats.format_ratio(r) == "1.12× (1.03–1.24); no A/A"


def test_gain_and_loss_must_clear_both_one_and_the_aa_range():
    aa = ratio(1.0, 0.97, 1.04)
    assert stats.verdict(ratio(1.2, 1.05, 1.3), aa) == "gain"
    assert stats.verdict(ratio(1.05, 1.02, 1.08), aa) == "noise"             # above 1.0, inside A/A
    assert stats.verdict(ratio(0.8, 0.7, 0.9), aa) == "loss"
    assert stats.verdict(ratio(0.97, 0.95, 0.98), aa) == "noise"             # below 1.0, inside A/A
    shifted = ratio(0.95, 0.93, 0.96)                                        # an A/A wholly below 1.0
    assert stats.verdict(ratio(0.98, 0.97, 0.99), shifted) == "noise"         # still below 1.0: no gain
    assert stats.verdict(ratio(1.5, 1.5, 1.5, pairs=1), aa) == "noise"        # one pair has no range
    assert stats.format_ratio(ratio(0.8, 0.7, 0.9), aa) == "0.80× (0.70–0.90) loss; A/A 0.97–1.04"


def test_the_aa_range_counts_both_ways():
    """The twin over its base spanning 0.998-1.26 says the base over its twin spans 0.79-1.002:
    either build could have been the twin, so a loss must clear 0.79, not 0.998 (p10's ladder:
    "p10 vs p07 triton 0.71x (0.49-0.81)" read as a loss under the one-sided rule)."""
    aa = ratio(1.16, 0.998, 1.26)
    assert stats.verdict(ratio(0.71, 0.49, 0.81), aa) == "noise"
    assert stats.verdict(ratio(0.65, 0.49, 0.78), aa) == "loss"
    low = ratio(0.9, 0.80, 1.02)                                             # twin slower: gains must clear 1.25
    assert stats.verdict(ratio(1.15, 1.10, 1.20), low) == "noise"
    assert stats.verdict(ratio(1.4, 1.3, 1.5), low) == "gain"


def test_bounds_that_round_to_one_get_three_decimals():
    assert stats.fmt_bound(0.996) == "0.996" and stats.fmt_bound(1.004) == "1.004"
    assert stats.fmt_bound(1.0) == "1.00" and stats.fmt_bound(1.02) == "1.02"
    assert stats.format_ratio(ratio(1.01, 0.996, 1.03), None, show_aa=False) == "1.01× (0.996–1.03) noise"
    assert stats.format_ratio(None) == "–"
