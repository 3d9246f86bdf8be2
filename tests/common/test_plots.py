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
