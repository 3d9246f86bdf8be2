"""The phase's bench module, the ladder: every phase through the same workload in one run. And
ServedLLM, still here: it gives the offline engine's tokens and dies with its parent."""
import importlib
import json

from common import report
from tests.suites.served import *  # noqa: F401,F403 - ServedLLM's tests and fixtures, collected here

PHASE = "p10_review"
bench = importlib.import_module(f"phases.{PHASE}.bench")


def engines_of(run: list[str]) -> list[str]:
    return run[run.index("--engines") + 1].split(",")


def test_parts_run_every_phase_through_one_workload():
    """The latency ladder: p01 to this phase and an HF peer (on a GPU in two halves that share
    p05); the concurrency ladder: the phases that batch (p02 on). Each phase with its defaults,
    p07 on its own kernel on a GPU; one comparison per part, with the previous phase's twin."""
    phases = [f"p{n:02d}" for n in range(1, 11)]
    gpu = [{"p07": "p07 attention_backend=triton"}.get(p, p) for p in phases]
    [a], [b] = bench.GPU_PARTS["ladder-latency-a"], bench.GPU_PARTS["ladder-latency-b"]
    assert sorted(engines_of(a)) == sorted(["p01#2", *gpu[:5], "hf-static"])
    assert sorted(engines_of(b)) == sorted(["p09#2", *gpu[4:], "hf-static"])
    [conc] = bench.GPU_PARTS["ladder-concurrency"]
    assert sorted(engines_of(conc)) == sorted(["p09#2", *gpu[1:]])
    [cpu_lat], [cpu_conc] = bench.CPU_PARTS["ladder-latency"], bench.CPU_PARTS["ladder-concurrency"]
    assert sorted(engines_of(cpu_lat)) == sorted(["p09#2", *phases, "hf-generate"])
    assert sorted(engines_of(cpu_conc)) == sorted(["p09#2", *phases[1:]])
    assert {run[run.index("--file") + 1] for run in (a, b)} == {"ladder-latency-a", "ladder-latency-b"}


def test_aa_noise_part_measures_p10_against_itself_with_and_without_noise_control():
    off, on = bench.GPU_PARTS["aa-noise"]
    for run, mode in ((off, "off"), (on, "on")):
        assert engines_of(run) == ["p10", "p10#2"] and run[run.index("--noise-control") + 1] == mode
        assert run[run.index("--concurrency") + 1] == "64" and "llama-1b" in run and "aa-noise" in run


def test_cpu_ladder_is_one_run_the_report_can_read(tmp_path):
    """Nine engines in one run: each phase's gain over the one before is a same-run ratio, and
    the report's tables treat p10 as this phase's own engine and the others as its baselines."""
    out = tmp_path / "concurrency.json"
    bench.main(["--part", "ladder-concurrency", "--out", str(out), "--concurrency", "2", "--repeats", "1"])
    records = [r | {"file": "x.json"} for r in json.loads(out.read_text())]
    assert sorted(r["engine"] for r in records) == sorted(["p09#2", *[f"p{n:02d}" for n in range(2, 11)]])
    assert len({r["run_id"] for r in records}) == 1 and {r["phase"] for r in records} == {PHASE}
    assert all(r["metrics"]["output_tok_s"] > 0 for r in records)
    assert all(r["aa"]["engine"] == "p09" for r in records)
    ladder_order = sorted((r for r in records if "#" not in r["engine"]), key=lambda r: r["engine"])
    for prev, cur in zip(ladder_order, ladder_order[1:]):
        assert report.same_run(records, cur, prev["engine"]) is prev
        assert report.paired_ratio(cur, prev, "output_tok_s")["pairs"] == 1
    table = report.before_after(records, PHASE, "cpu", "concurrency")
    assert "**p10**" in table and "p10 vs p09" in table and "p10 vs p02" in table
    ladder = report.ladder_device(records, "cpu")
    assert ladder.count("| p10 |") == 1 and "| p09 |" not in ladder   # the ladder row is this phase's own
