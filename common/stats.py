"""Repeated samples and same-run ratios. Torch-free: the report uses it too.

A record holds one sample per repeat ({"repeat": i, metric: value, ...}); its metrics are the
medians, its spread the min-max. Two engines of one run were measured in the same repeat rounds
(A B C, B C A, ...), so their ratio is taken per repeat pair: round i of A over round i of B.

What a reader may trust is decided against an A/A control: the baseline built twice ("p06" and
"p06#2", two instances of identical code) and measured like the rest. Their ratio would be 1.0 on
a quiet machine; its range is how far identical code moves in this run. A ratio is a gain only
where its whole range lies above both 1.0 and the A/A range, a loss only where it lies below both;
everything else is noise. The A/A range counts both ways (verdict): the two builds are
interchangeable. Without an A/A pair (records made before the control existed) the old rule
stands, and says so: a range that excludes 1.0 is a gain or a loss, "no A/A".
"""
from __future__ import annotations

import statistics

# Metrics where smaller is better (and every time in ms, "*_ms"); every other metric is a rate,
# larger is better.
LOWER_IS_BETTER = {"ms_per_token", "wall_s", "ttft_s_p50", "itl_ms_p50", "peak_mem_gib", "wall_ms_per_step",
                   "kernels_per_step", "syncs_per_step", "num_preemptions"}
TWIN = "#2"                     # engine suffix of the A/A control's second instance: "p06#2"


def higher_is_better(key: str) -> bool:
    return key not in LOWER_IS_BETTER and not key.endswith("_ms")


def numeric_keys(samples: list[dict]) -> list[str]:
    """Metric names every sample has a number for (the repeat index is not a metric)."""
    keys = [k for k, v in samples[0].items() if isinstance(v, (int, float)) and k != "repeat"]
    return [k for k in keys if all(isinstance(s.get(k), (int, float)) for s in samples)]


def summarize(samples: list[dict]) -> tuple[dict, dict]:
    """(medians, spread) over the samples: {metric: median}, {metric: [min, max]}."""
    medians, spread = {}, {}
    for key in numeric_keys(samples):
        values = [s[key] for s in samples]
        medians[key] = statistics.median(values)
        spread[key] = [min(values), max(values)]
    return medians, spread


def paired_ratio(a: dict, b: dict, key: str) -> dict | None:
    """Ratio of record a's metric over record b's, per repeat pair, when both come from one run.

    Returns {"median", "min", "max", "pairs"} or None when the two were not measured together
    (different run ids, or no repeat both have). For a lower-is-better metric the ratio is b/a,
    so a ratio above 1 always means a is better."""
    if not a.get("run_id") or a.get("run_id") != b.get("run_id"):
        return None
    by_repeat = {s.get("repeat"): s.get(key) for s in b.get("samples") or []}
    ratios = []
    for s in a.get("samples") or []:
        mine, theirs = s.get(key), by_repeat.get(s.get("repeat"))
        if isinstance(mine, (int, float)) and isinstance(theirs, (int, float)) and mine > 0 and theirs > 0:
            ratios.append(mine / theirs if higher_is_better(key) else theirs / mine)
    if not ratios:
        return None
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "pairs": len(ratios)}


# --- the rule: gain, loss or noise ----------------------------------------------------------------
def verdict(r: dict, aa: dict | None = None) -> str:
    """"gain", "loss" or "noise" for ratio r, judged against the A/A ratio aa of the same run.

    Which of the two identical builds is the twin is arbitrary, so identical code moves both ways
    by the A/A range: twin/base spanning 0.998-1.26 means base/twin spans 0.79-1.002. The band is
    that range with its reciprocal; gain: r's whole range above the band (and 1.0), loss: below it.
    A ratio of one repeat pair has no range, so it is noise. With aa None the old rule: the range
    against 1.0."""
    if r.get("pairs", 2) < 2:
        return "noise"
    hi = max(1.0, aa["max"], 1 / aa["min"]) if aa else 1.0
    lo = min(1.0, aa["min"], 1 / aa["max"]) if aa else 1.0
    if r["min"] > hi:
        return "gain"
    if r["max"] < lo:
        return "loss"
    return "noise"


def within_noise(r: dict, aa: dict | None = None) -> bool:
    """True where verdict(r, aa) is "noise": no gain and no loss."""
    return verdict(r, aa) == "noise"


def fmt_bound(x: float) -> str:
    """Two decimals, three where two would print 1.00 for a number that is not 1.0: a bound of
    0.996 and one of 1.004 read differently against 1.0, and "1.00" hides which it is."""
    text = f"{x:.2f}"
    return f"{x:.3f}" if text == "1.00" and x != 1.0 else text


def format_range(r: dict) -> str:
    """"3.41–3.60" (min–max) or "1 pair, no range"."""
    return "1 pair, no range" if r.get("pairs", 2) < 2 else f"{fmt_bound(r['min'])}–{fmt_bound(r['max'])}"


def format_aa(aa: dict | None) -> str:
    """"A/A 0.97–1.04" or "no A/A"."""
    return f"A/A {format_range(aa)}" if aa else "no A/A"


def format_ratio(r: dict | None, aa: dict | None = None, *, show_aa: bool = True) -> str:
    """"3.52× (3.41–3.60); A/A 0.97–1.04", "1.12× (1.03–1.24) noise; A/A 0.88–1.12",
    "0.81× (0.78–0.84) loss; A/A ...", "1.19× (1 pair, no range) noise; no A/A"; "–" for no
    same-run ratio. show_aa=False leaves the A/A clause out (a table that states it per row)."""
    if r is None:
        return "–"
    text = f"{fmt_bound(r['median'])}× ({format_range(r)})"
    word = verdict(r, aa)
    text += "" if word == "gain" else f" {word}"
    return f"{text}; {format_aa(aa)}" if show_aa else text
