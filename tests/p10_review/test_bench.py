"""The phase's bench module, the ladder: every phase through the same workload in one run. And
ServedLLM, still here: it gives the offline engine's tokens and dies with its parent."""
import importlib
import json

from common import report
from tests.suites.served import *  # noqa: F401,F403 - ServedLLM's tests and fixtures, collected here

PHASE = "p10_review"
bench = importlib.import_module(f"phases.{PHASE}.bench")


def test_parts_run_every_phase_through_one_workload():
    """The latency ladder: p01 to this phase and an HF peer; the concurrency ladder: the phases
    that batch (p02 on). Plain specs, each phase with its defaults, one comparison per part."""
    phases = [f"p{n:02d}" for n in range(1, 11)]
    for parts, peer in ((bench.GPU_PARTS, "hf-static"), (bench.CPU_PARTS, "hf-generate")):
        assert set(parts) == {"ladder-latency", "ladder-concurrency"}
        for name, runs in parts.items():
            [run] = runs
            workload = run[run.index("--workload") + 1]
            engines = run[run.index("--engines") + 1].split(",")
            assert workload == name.removeprefix("ladder-")
            assert engines == ([*phases, peer] if workload == "latency" else phases[1:])


def test_cpu_ladder_is_one_run_the_report_can_read(tmp_path):
    """Nine engines in one run: each phase's gain over the one before is a same-run ratio, and
    the report's tables treat p10 as this phase's own engine and the others as its baselines."""
    out = tmp_path / "concurrency.json"
    bench.main(["--part", "ladder-concurrency", "--out", str(out), "--concurrency", "2", "--repeats", "1"])
    records = [r | {"file": "x.json"} for r in json.loads(out.read_text())]
    assert [r["engine"] for r in records] == [f"p{n:02d}" for n in range(2, 11)]
    assert len({r["run_id"] for r in records}) == 1 and {r["phase"] for r in records} == {PHASE}
    assert all(r["metrics"]["output_tok_s"] > 0 for r in records)
    for prev, cur in zip(records, records[1:]):
        assert report.same_run(records, cur, prev["engine"]) is prev
        assert report.paired_ratio(cur, prev, "output_tok_s")["pairs"] == 1
    table = report.before_after(records, PHASE, "cpu", "concurrency")
    assert "**p10**" in table and "p10 vs p09" in table and "p10 vs p02" in table
    ladder = report.ladder_device(records, "cpu")
    assert ladder.count("| p10 |") == 1 and "| p09 |" not in ladder   # the ladder row is this phase's own
