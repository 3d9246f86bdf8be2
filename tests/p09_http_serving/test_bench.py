"""The phase's bench module and ServedLLM: the engine offline against the same engine behind its
HTTP server, in one run; the served engine gives the offline engine's tokens and dies with its parent."""
import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from common.sampling import SamplingParams

PHASE = "p09_http_serving"
bench = importlib.import_module(f"phases.{PHASE}.bench")
phase = importlib.import_module(f"phases.{PHASE}")
OPTIONS = {"device": "cpu", "dtype": "float32", "kv_cache_bytes": 4 << 20}


def test_parts_compare_the_engine_offline_and_behind_its_server():
    for parts in (bench.GPU_PARTS, bench.CPU_PARTS):
        for runs in parts.values():
            [run] = runs
            assert run[run.index("--engines") + 1].split(",") == ["p09", "p09 server=http"]
            assert run[run.index("--workload") + 1] == "concurrency"


@pytest.fixture(scope="module")
def served():
    llm = phase.ServedLLM("tiny-llama", server="http", **OPTIONS)
    yield llm
    llm.shutdown()


def test_served_engine_gives_the_offline_tokens(served):
    prompts = [[100 + i + j for j in range(3 + 5 * i)] for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    want = phase.LLM("tiny-llama", **OPTIONS).generate(prompts, params)
    got = served.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert all(len(o.token_times) == 8 and o.ttft > 0 for o in got)
    with pytest.raises(ValueError, match="greedy"):
        served.generate(prompts, SamplingParams(temperature=0.7, max_tokens=8, ignore_eos=True))


def test_cpu_part_records_both_engines_in_one_run(tmp_path):
    out = tmp_path / "serving.json"
    bench.main(["--part", "serving", "--out", str(out), "--concurrency", "2", "--repeats", "1"])
    records = json.loads(out.read_text())
    assert sorted(r["setting"].get("server", "offline") for r in records) == ["http", "offline"]
    assert len({r["run_id"] for r in records}) == 1
    assert all(r["metrics"]["output_tok_s"] > 0 for r in records)


def test_server_dies_with_its_parent(tmp_path):
    """A parent killed outright (SIGKILL, no cleanup) takes the server and its engine along."""
    script = textwrap.dedent(f"""
        import os, sys
        from phases.{PHASE} import ServedLLM
        llm = ServedLLM("tiny-llama", device="cpu", dtype="float32", kv_cache_bytes=1 << 20)
        print(llm.proc.pid, flush=True)
        sys.stdin.read()
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=os.environ | {"PYTHONPATH": os.getcwd()})
    server_pid = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(server_pid, signal.SIGKILL)
    pytest.fail("the server outlived its parent")
