"""Small matplotlib helpers for the notebooks (inline in a notebook; elsewhere Agg: files, no windows).

Every helper takes result records (common.report.load_records) already narrowed to one device and
one workload, draws on a given Axes and puts the device in the title, so no plot hides where it ran.
Where several records share a cell (same engine, preset, setting), the newest is drawn. A ratio
between engines is drawn only between records of one run, per repeat pair, median with its
min-max range as an error bar (common.stats.paired_ratio); records of different runs are never divided.
Beside a ratio stands its run's A/A range (the baseline built twice, common.report.aa_ratio), a
grey band: a ratio whose bar does not clear the band and 1.0 is noise (common.stats.verdict).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import matplotlib

# Agg (files, no windows) unless a backend was asked for: a notebook's kernel asks for the inline
# one (common.notebooks.kernel_env), which puts every figure a cell shows or leaves open into the
# cell's output; under Agg, plt.show() draws nothing and the executed notebook holds no image.
if not os.environ.get("MPLBACKEND"):
    matplotlib.use("Agg")
import matplotlib.pyplot as plt   # noqa: E402  (after choosing the backend)

from .report import (aa_ratio, is_twin, metric, newest, order_devices, order_engines, order_presets,  # noqa: E402
                     same_run, select)
from .results import ROOT   # noqa: E402
from .stats import TWIN, paired_ratio   # noqa: E402

COLORS = {"hf-generate": "tab:gray", "hf-static": "tab:olive", "hf-generate-nocudnn": "tab:brown"}


def color(engine: str, engines: list[str]) -> str:
    """Peers keep fixed colours; phase engines "pNN" take cycle colour NN-1 (the same in every plot);
    an A/A twin ("p05#2") its baseline's; other names take the default cycle in order."""
    base = engine.replace(TWIN, "")
    if base in COLORS:
        return COLORS[base]
    if re.fullmatch(r"p\d\d", base):
        return f"C{(int(base[1:]) - 1) % 10}"
    mine = [e for e in engines if e not in COLORS]
    return f"C{mine.index(engine) % 10}"


def devices(records: list[dict]) -> list[str]:
    """Devices present, GPUs first, CPU last."""
    return order_devices(r["device"] for r in records)


def grid(records: list[dict], key: str) -> tuple[list[str], list[str], dict]:
    """(presets, engines, {(preset, engine): newest record with `key`}) for grouped bars."""
    have = [r for r in records if metric(r, key) is not None]
    presets = order_presets(r["preset"] for r in have)
    engines = order_engines(r["engine"] for r in have)
    cells = {(p, e): newest(select(have, preset=p, engine=e)) for p in presets for e in engines}
    return presets, engines, cells


def title(ax, text: str, records: list[dict]) -> None:
    """Axes title that always names the device(s) and dtype(s) the records ran on."""
    where = ", ".join(devices(records))
    dtypes = ", ".join(sorted({str(r.get("dtype")) for r in records}))
    ax.set_title(f"{text}\n{where} ({dtypes})", fontsize=10)


def bar_by_engine(records: list[dict], key: str, ax, *, scale: float = 1.0, fmt: str = "{:.0f}",
                  ylabel: str | None = None, text: str | None = None, log: bool | None = None) -> None:
    """Bars of metric `key` (times `scale`): one group per preset, one bar per engine, labelled.

    log=None picks a log axis when values span more than 30x (e.g. 135M vs 8B models)."""
    presets, engines, cells = grid(records, key)
    if not presets:
        ax.text(0.5, 0.5, f"no {key} in these records", ha="center", transform=ax.transAxes)
        return
    width = 0.8 / len(engines)
    values = []
    for j, engine in enumerate(engines):
        xs = [i + (j - (len(engines) - 1) / 2) * width for i in range(len(presets))]
        ys = [scale * (metric(cells[p, engine], key) or 0) for p in presets]
        bars = ax.bar(xs, ys, width, label=engine, color=color(engine, engines))
        ax.bar_label(bars, [fmt.format(y) if y else "" for y in ys], fontsize=7, padding=2)
        values += [y for y in ys if y]
    _finish(ax, presets, values, log, ylabel or key)
    title(ax, text or key, records)


def _finish(ax, presets: list[str], values: list[float], log: bool | None, ylabel: str) -> None:
    ax.set_xticks(range(len(presets)), presets)
    ax.set_ylabel(ylabel)
    if log if log is not None else max(values) > 30 * min(values):
        ax.set_yscale("log")
    ax.margins(y=0.15)
    ax.legend(fontsize=8)


def roofline(records: list[dict], ax, *, text: str = "ms per token vs bandwidth floor") -> None:
    """Achieved ms/token per engine (bars) against each preset's bandwidth floor (black line).

    floor = (weight bytes + KV bytes read) / measured copy bandwidth; nothing can be faster.
    The axis turns logarithmic when the floors sit far below the bars."""
    bar_by_engine(records, "ms_per_token", ax, fmt="{:.2f}", ylabel="ms / token (lower is better)", text=text,
                  log=False)
    presets, _, _ = grid(records, "ms_per_token")
    floors = {p: [f for r in select(records, preset=p) if (f := metric(r, "roofline_ms_per_token")) is not None]
              for p in presets}
    for i, preset in enumerate(presets):
        if floors[preset]:
            floor = min(floors[preset])
            ax.hlines(floor, i - 0.45, i + 0.45, colors="black", linewidth=2,
                      label="bandwidth floor" if i == 0 else None)
            ax.annotate(f"floor {floor:.3g}", (i - 0.45, floor), fontsize=7, va="bottom", ha="left")
    lows = [min(f) for f in floors.values() if f]
    highs = [metric(r, "ms_per_token") or 0 for r in records]
    if lows and max(highs) > 30 * min(lows):
        ax.set_yscale("log")
    if lows:
        ax.legend(fontsize=8)


def roofline_frac(records: list[dict], ax, *, text: str = "% of bandwidth roofline") -> None:
    """Fraction of the bandwidth floor each engine reaches (100% = reads at copy speed)."""
    bar_by_engine(records, "roofline_frac", ax, scale=100, fmt="{:.1f}%", ylabel="% of roofline", text=text,
                  log=False)
    ax.axhline(100, color="black", linewidth=1, linestyle="--")


def latency_figure(records: list[dict]):
    """The latency panels for one device: tok/s, ms/token vs floor, % of roofline; records without
    a roofline (a CPU's, common.report) get the first two, without a floor."""
    with_roofline = any(metric(r, "roofline_frac") is not None for r in records)
    fig, axes = plt.subplots(1, 3 if with_roofline else 2, figsize=(16 if with_roofline else 11, 4.5))
    bar_by_engine(records, "decode_tok_s", axes[0], ylabel="decode tok/s (higher is better)",
                  text="batch-1 decode speed")
    roofline(records, axes[1], text="ms per token vs bandwidth floor" if with_roofline else "ms per token")
    if with_roofline:
        roofline_frac(records, axes[2])
    fig.tight_layout()
    return fig


def setting(rec: dict, x: str = "concurrency"):
    """One field of a record's setting, e.g. its concurrency level (None if absent)."""
    return (rec.get("setting") or {}).get(x)


def line_by_engine(records: list[dict], key: str, ax, *, x: str = "concurrency", base: str | None = None,
                   scale: float = 1.0, fmt: str | None = None, ylabel: str | None = None,
                   text: str | None = None, engines: list[str] | None = None) -> None:
    """Metric `key` (times `scale`) against setting[x], one line per engine, log-2 x axis.

    base="hf-generate" plots each engine over that engine measured in the same run at the same x,
    per repeat pair: the median, with the min-max range as an error bar (base = dashed 1.0; a
    point without a same-run base is left out). fmt labels every point; the newest record is
    drawn where several share (engine, x)."""
    have = [r for r in records if metric(r, key) is not None and setting(r, x) is not None]
    engines = engines or order_engines(r["engine"] for r in have if not is_twin(r["engine"]))
    xs = sorted({setting(r, x) for r in have})

    def rec(engine, v):
        return newest([r for r in have if r["engine"] == engine and setting(r, x) == v])
    for engine in [e for e in engines if e != base]:
        pts = []                                  # (x, y, low, high)
        for v in xs:
            mine = rec(engine, v)
            if mine is None:
                continue
            if base is None:
                y = metric(mine, key)
                pts.append((v, y, y, y))
            elif (r := paired_ratio(mine, same_run(have, mine, base) or {}, key)) is not None:
                pts.append((v, r["median"], r["min"], r["max"]))
        if not pts:
            continue
        vs, ys = [p[0] for p in pts], [scale * p[1] for p in pts]
        errs = [[scale * (p[1] - p[2]) for p in pts], [scale * (p[3] - p[1]) for p in pts]]
        ax.errorbar(vs, ys, yerr=errs if base else None, marker="o", capsize=3, label=engine,
                    color=color(engine, engines))
        for v, y in zip(vs, ys) if fmt else []:   # point labels only when asked for
            ax.annotate(fmt.format(y), (v, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if base:
        ax.axhline(1.0, color=color(base, engines), linewidth=1, linestyle="--", label=f"{base} = 1 (same run)")
        aa_band(ax, have, base, key, xs, scale)
    if xs:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(v) for v in xs])
        ax.minorticks_off()
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel or key)
    ax.legend(fontsize=8)
    title(ax, text or key, records)


def aa_band(ax, records: list[dict], base: str, key: str, xs: list, scale: float = 1.0) -> None:
    """Grey bars at each x: the A/A range of the base's run there (no bar where the run had no twin)."""
    drawn = False
    for v in xs:
        rec = newest([r for r in records if r["engine"] == base and setting(r) == v])
        aa = aa_ratio(records, rec, key)
        if aa:
            ax.fill_between([v / 1.15, v * 1.15], scale * aa["min"], scale * aa["max"], color="grey", alpha=0.3,
                            label=None if drawn else "A/A range (same run)")
            drawn = True


def part_of_step(records: list[dict], ax, *, part_key: str = "gather_ms", total_key: str = "step_ms",
                 x: str = "concurrency", part_label: str = "gather", rest_label: str = "rest of step",
                 xlabel: str | None = None, ylabel: str = "ms per step",
                 text: str = "one step: a part vs the rest") -> None:
    """Stacked bars: each record's `total_key` split into `part_key` (hatched) and the rest, one
    group per setting[x], one bar per engine, labelled with the part's share of the total."""
    have = [r for r in records if metric(r, total_key) is not None and metric(r, part_key) is not None]
    engines = order_engines(r["engine"] for r in have)
    xs = sorted({setting(r, x) for r in have})
    width = 0.8 / max(len(engines), 1)
    for j, engine in enumerate(engines):
        first = True                        # legend entries once per engine
        for i, v in enumerate(xs):
            rec = newest([r for r in have if r["engine"] == engine and setting(r, x) == v])
            if rec is None:
                continue
            total, part = metric(rec, total_key), metric(rec, part_key)
            pos = i + (j - (len(engines) - 1) / 2) * width
            ax.bar(pos, part, width, color=color(engine, engines), hatch="//", edgecolor="black",
                   label=f"{engine}: {part_label}" if first else None)
            ax.bar(pos, total - part, width, bottom=part, color=color(engine, engines), alpha=0.35,
                   label=f"{engine}: {rest_label}" if first else None)
            ax.annotate(f"{100 * part / total:.0f}%", (pos, total), ha="center", va="bottom", fontsize=7)
            first = False
    ax.set_xticks(range(len(xs)), [str(v) for v in xs])
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel(ylabel)
    ax.margins(y=0.15)
    ax.legend(fontsize=8)
    title(ax, text, have or records)


def runs_figure(runs: list[tuple[dict, dict]], ylabel: str, text: str, aas: list[dict | None] | None = None):
    """One point per run (report.headline_runs: a record and its same-run ratio), oldest first:
    the median of the run's repeat pairs, the bar their min-max; the dotted line is no change;
    `aas`, one per run where given: that run's A/A range, a grey band behind its point."""
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    for i, (_, r) in enumerate(runs):
        ax.errorbar([i], [r["median"]], yerr=[[r["median"] - r["min"]], [r["max"] - r["median"]]],
                    fmt="o", color="C0", capsize=4)
        aa = (aas or [None] * len(runs))[i]
        if aa:
            ax.fill_between([i - 0.3, i + 0.3], aa["min"], aa["max"], color="grey", alpha=0.3)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    labels = [f"{rec['provenance']['utc'][:16].replace('T', ' ')}\ngit {rec['provenance']['git_sha'][:7]}"
              for rec, _ in runs]
    ax.set_xticks(range(len(runs)), labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(text, fontsize=9)
    ax.set_ylim(bottom=0)
    return fig


def png_path(records: list[dict], suffix: str = "") -> Path:
    """results/<phase>/<workload>-<device>.png beside the JSON the records came from."""
    file = Path(records[0]["file"])
    return file.with_name(file.stem + suffix + ".png")


def save(fig, path: str | Path, dpi: int = 110) -> Path:
    """Write a PNG (creating the folder) and close the figure; returns the path written.

    With MINI_INFER_FIGURES set to a folder (the notebook tests set it), a path inside the
    repository is written under that folder instead, so a test run leaves the committed PNGs alone."""
    path = _figure_path(Path(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return path


def _figure_path(path: Path) -> Path:
    """`path`, or its place under $MINI_INFER_FIGURES when that is set and `path` is in the repo."""
    redirect = os.environ.get("MINI_INFER_FIGURES")
    if not redirect:
        return path
    full = path if path.is_absolute() else Path.cwd() / path
    try:
        return Path(redirect) / full.resolve().relative_to(ROOT)
    except ValueError:                 # outside the repository: nothing committed to protect
        return path
