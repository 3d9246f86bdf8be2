"""Small matplotlib helpers for the notebooks (Agg backend: files, no windows).

Every helper takes result records (common.results.read_records) already narrowed to one device and
one workload, draws on a given Axes and puts the device in the title, so no plot hides where it ran.
"""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt   # noqa: E402  (after choosing the backend)

from .report import best, metric, order_devices, order_engines, order_presets, select   # noqa: E402

COLORS = {"hf-generate": "tab:gray", "hf-static": "tab:olive", "hf-generate-nocudnn": "tab:brown"}


def color(engine: str, engines: list[str]) -> str:
    """Peers keep fixed colours; phase engines "pNN" take cycle colour NN-1 (the same in every plot);
    other names take the default cycle in order."""
    if engine in COLORS:
        return COLORS[engine]
    if re.fullmatch(r"p\d\d", engine):
        return f"C{(int(engine[1:]) - 1) % 10}"
    mine = [e for e in engines if e not in COLORS]
    return f"C{mine.index(engine) % 10}"


def devices(records: list[dict]) -> list[str]:
    """Devices present, GPUs first, CPU last."""
    return order_devices(r["device"] for r in records)


def grid(records: list[dict], key: str) -> tuple[list[str], list[str], dict]:
    """(presets, engines, {(preset, engine): best record by `key`}) for grouped bars."""
    presets = order_presets(r["preset"] for r in records if metric(r, key) is not None)
    engines = order_engines(r["engine"] for r in records if metric(r, key) is not None)
    cells = {(p, e): best(select(records, preset=p, engine=e), key) for p in presets for e in engines}
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
    ax.legend(fontsize=8)


def roofline_frac(records: list[dict], ax, *, text: str = "% of bandwidth roofline") -> None:
    """Fraction of the bandwidth floor each engine reaches (100% = reads at copy speed)."""
    bar_by_engine(records, "roofline_frac", ax, scale=100, fmt="{:.1f}%", ylabel="% of roofline", text=text,
                  log=False)
    ax.axhline(100, color="black", linewidth=1, linestyle="--")


def latency_figure(records: list[dict]):
    """The three latency panels for one device: tok/s, ms/token vs floor, % of roofline."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    bar_by_engine(records, "decode_tok_s", axes[0], ylabel="decode tok/s (higher is better)",
                  text="batch-1 decode speed")
    roofline(records, axes[1])
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

    base="hf-generate" plots each engine divided by that engine at the same x (base = dashed 1.0);
    fmt labels every point; the best record wins where several share (engine, x)."""
    have = [r for r in records if metric(r, key) is not None and setting(r, x) is not None]
    engines = engines or order_engines(r["engine"] for r in have)
    xs = sorted({setting(r, x) for r in have})

    def value(engine, v):
        return metric(best([r for r in have if r["engine"] == engine and setting(r, x) == v], key), key)
    for engine in [e for e in engines if e != base]:
        pts = [(v, y / (value(base, v) if base else 1)) for v in xs
               if (y := value(engine, v)) is not None and (not base or value(base, v))]
        if pts:
            ax.plot([p[0] for p in pts], [scale * p[1] for p in pts], marker="o", label=engine,
                    color=color(engine, engines))
            for v, y in pts if fmt else []:       # point labels only when asked for
                ax.annotate(fmt.format(scale * y), (v, scale * y), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
    if base:
        ax.axhline(1.0, color=color(base, engines), linewidth=1, linestyle="--", label=f"{base} = 1")
    if xs:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(v) for v in xs])
        ax.minorticks_off()
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel or key)
    ax.legend(fontsize=8)
    title(ax, text or key, records)


def step_split(records: list[dict], ax, *, text: str = "decode step: KV gather vs the rest") -> None:
    """Stacked bars from "gather" records: each step_ms split into gather_ms (hatched) and the rest,
    one group per concurrency level, one bar per engine, labelled with the gather's share."""
    engines = order_engines(r["engine"] for r in records)
    xs = sorted({setting(r) for r in records})
    width = 0.8 / max(len(engines), 1)
    for j, engine in enumerate(engines):
        first = True                        # legend entries once per engine
        for i, v in enumerate(xs):
            rec = best([r for r in records if r["engine"] == engine and setting(r) == v], "step_ms")
            if rec is None:
                continue
            step, gather = metric(rec, "step_ms"), metric(rec, "gather_ms")
            pos = i + (j - (len(engines) - 1) / 2) * width
            ax.bar(pos, gather, width, color=color(engine, engines), hatch="//", edgecolor="black",
                   label=f"{engine}: gather" if first else None)
            ax.bar(pos, step - gather, width, bottom=gather, color=color(engine, engines), alpha=0.35,
                   label=f"{engine}: rest of step" if first else None)
            ax.annotate(f"{100 * gather / step:.0f}%", (pos, step), ha="center", va="bottom", fontsize=7)
            first = False
    ax.set_xticks(range(len(xs)), [str(v) for v in xs])
    ax.set_xlabel("concurrency (sequences in the decode step)")
    ax.set_ylabel("ms per decode step")
    ax.margins(y=0.15)
    ax.legend(fontsize=8)
    title(ax, text, records)


def png_path(records: list[dict], suffix: str = "") -> Path:
    """results/<phase>/<workload>-<device>.png beside the JSON the records came from."""
    file = Path(records[0]["file"])
    return file.with_name(file.stem + suffix + ".png")


def save(fig, path: str | Path, dpi: int = 110) -> Path:
    """Write a PNG (creating the folder) and close the figure; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return path
