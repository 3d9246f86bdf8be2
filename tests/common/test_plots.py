"""common.plots' latency figure: three panels where the records carry a roofline, two where they
do not (a CPU's latency records lose it in common.report)."""
import matplotlib

matplotlib.use("Agg")

from common import plots  # noqa: E402


def latency(engine, tok_s, **roofline):
    return {"engine": engine, "preset": "tiny-llama", "workload": "latency", "device": "cpu",
            "metrics": {"decode_tok_s": tok_s, "ms_per_token": 1e3 / tok_s, **roofline}}


def test_latency_figure_has_a_roofline_panel_only_with_a_roofline():
    plain = [latency("p01", 100.0), latency("hf-generate", 80.0)]
    assert len(plots.latency_figure(plain).axes) == 2
    floored = [latency("p01", 100.0, roofline_ms_per_token=5.0, roofline_frac=0.5)]
    fig = plots.latency_figure(floored)
    assert len(fig.axes) == 3 and fig.axes[2].get_ylabel() == "% of roofline"


def _blank():
    fig, ax = plots.plt.subplots()
    ax.plot([0, 1], [0, 1])
    return fig


def test_save_redirects_repo_paths_under_mini_infer_figures(tmp_path, monkeypatch):
    """Tests set MINI_INFER_FIGURES so a notebook run leaves the committed PNGs alone."""
    monkeypatch.setenv("MINI_INFER_FIGURES", str(tmp_path / "figures"))
    monkeypatch.chdir(plots.ROOT)
    wrote = plots.save(_blank(), "results/p00_none/latency-cpu.png")
    assert wrote == tmp_path / "figures" / "results/p00_none/latency-cpu.png"
    assert wrote.is_file() and not (plots.ROOT / "results/p00_none").exists()
    outside = tmp_path / "elsewhere" / "x.png"          # not in the repository: written where asked
    assert plots.save(_blank(), outside) == outside and outside.is_file()


def test_save_writes_where_asked_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("MINI_INFER_FIGURES", raising=False)
    assert plots.save(_blank(), tmp_path / "a" / "b.png").is_file()


def test_ratio_lines_draw_the_runs_aa_range_and_leave_the_twin_out():
    """base= draws each engine over the base per repeat pair, with the base's A/A range as a grey
    band; the twin ("p02#2") is no line of its own."""
    def conc(engine, c, values):
        return {"engine": engine, "preset": "llama-1b", "workload": "concurrency", "device": "cpu", "run_id": "r",
                "setting": {"concurrency": c}, "metrics": {"output_tok_s": values[0]},
                "samples": [{"repeat": i, "output_tok_s": v} for i, v in enumerate(values)]}
    recs = [conc("p02", 8, [100, 100]), conc("p02#2", 8, [95, 105]), conc("p03", 8, [150, 160])]
    fig, ax = plots.plt.subplots()
    plots.line_by_engine(recs, "output_tok_s", ax, base="p02")
    labels = ax.get_legend_handles_labels()[1]
    assert "p03" in labels and "p02#2" not in labels and "A/A range (same run)" in labels
