"""Repeated samples and same-run ratios (DESIGN section 6). Torch-free: the report uses it too.

A record holds one sample per repeat ({"repeat": i, metric: value, ...}); its metrics are the
medians, its spread the min-max. Two engines of one run were measured in the same repeat rounds
(A B C, B C A, ...), so their ratio is taken per repeat pair: round i of A over round i of B.
The spread of those ratios is what a reader may trust; one whose range includes 1.0 is noise.
"""
from __future__ import annotations

import statistics

# Metrics where smaller is better (and every time in ms, "*_ms"); every other metric is a rate,
# larger is better.
LOWER_IS_BETTER = {"ms_per_token", "wall_s", "ttft_s_p50", "itl_ms_p50", "peak_mem_gib", "wall_ms_per_step",
                   "kernels_per_step", "syncs_per_step"}


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


def within_noise(r: dict) -> bool:
    """A ratio whose range includes 1.0 is no gain (and no loss): it is noise. So is a ratio of
    one repeat pair: it has no range, so it cannot be told from noise."""
    return r.get("pairs", 2) < 2 or r["min"] <= 1.0 <= r["max"]


def format_ratio(r: dict | None) -> str:
    """"3.52× (3.41–3.60)", "1.02× (0.97–1.06) noise", or "1.19× (1 pair, no range) noise";
    "–" for no same-run ratio."""
    if r is None:
        return "–"
    spread = "1 pair, no range" if r.get("pairs", 2) < 2 else f"{r['min']:.2f}–{r['max']:.2f}"
    text = f"{r['median']:.2f}× ({spread})"
    return text + " noise" if within_noise(r) else text
