"""The phase's bench module and ServedLLM: the engine offline against the same engine behind its
HTTP server, in one run; the served engine gives the offline engine's tokens and dies with its parent."""
import importlib
import json

from tests.suites.served import *  # noqa: F401,F403 - ServedLLM's tests and fixtures, collected here

PHASE = "p09_http_serving"
bench = importlib.import_module(f"phases.{PHASE}.bench")


def test_parts_compare_the_engine_offline_and_behind_its_server():
    for parts in (bench.GPU_PARTS, bench.CPU_PARTS):
        for runs in parts.values():
            [run] = runs
            assert run[run.index("--engines") + 1].split(",") == ["p09", "p09#2", "p09 server=http"]
            assert run[run.index("--workload") + 1] == "concurrency"


def test_cpu_part_records_both_engines_in_one_run(tmp_path):
    out = tmp_path / "serving.json"
    bench.main(["--part", "serving", "--out", str(out), "--concurrency", "2", "--repeats", "1"])
    records = json.loads(out.read_text())
    assert sorted(r["setting"].get("server", "offline") for r in records) == ["http", "offline", "offline"]
    assert sorted(r["engine"] for r in records) == ["p09", "p09", "p09#2"]
    assert len({r["run_id"] for r in records}) == 1
    assert all(r["metrics"]["output_tok_s"] > 0 for r in records)
