"""ServedLLM (phase 09 on): the engine behind its HTTP server, with generate(), as the benchmark
harness drives it. It gives the offline engine's tokens, dies with its parent, and exits (status 1,
for a supervisor to restart it) when its engine process dies."""
import importlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from common.sampling import SamplingParams

OPTIONS = {"device": "cpu", "dtype": "float32", "kv_cache_bytes": 4 << 20}


@pytest.fixture(scope="module")
def module(phase):
    return importlib.import_module(f"phases.{phase}")


@pytest.fixture(scope="module")
def served(module):
    llm = module.ServedLLM("tiny-llama", server="http", **OPTIONS)
    yield llm
    llm.shutdown()


def test_served_engine_gives_the_offline_tokens(served, module):
    prompts = [[100 + i + j for j in range(3 + 5 * i)] for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    want = module.LLM("tiny-llama", **OPTIONS).generate(prompts, params)
    got = served.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert all(len(o.token_times) == 8 and o.ttft > 0 for o in got)
    with pytest.raises(ValueError, match="greedy"):
        served.generate(prompts, SamplingParams(temperature=0.7, max_tokens=8, ignore_eos=True))


def hold_a_server(module, pids) -> None:
    """A ServedLLM's parent until it is killed: sends the server's pid, then waits."""
    llm = module.ServedLLM("tiny-llama", device="cpu", dtype="float32", kv_cache_bytes=1 << 20)
    pids.send(llm.proc.pid)
    time.sleep(600)


@pytest.mark.server_process
def test_server_dies_with_its_parent(module):
    """A parent killed outright (SIGKILL, no cleanup) takes the server and its engine along. The
    parent is forked from this process, which has imported the engine already (a new interpreter
    spends seconds on it)."""
    fork = multiprocessing.get_context("fork")
    receive, send = fork.Pipe(duplex=False)
    parent = fork.Process(target=hold_a_server, args=(module, send), daemon=True)
    parent.start()
    try:
        while not receive.poll(0.1):
            assert parent.is_alive(), f"the parent exited with code {parent.exitcode} before its server was up"
        server_pid = receive.recv()
    finally:
        parent.kill()
        parent.join()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(server_pid, signal.SIGKILL)
    pytest.fail("the server outlived its parent")


@pytest.mark.server_process
def test_ctrl_c_stops_the_server_cleanly(phase):
    """Ctrl-C (SIGINT, as ServedLLM.shutdown sends it) ends the server with status 0 and no
    traceback: uvicorn re-raises the interrupt after its graceful shutdown."""
    port = importlib.import_module(f"phases.{phase}.worker_pool").free_port()
    cmd = [sys.executable, "-m", f"phases.{phase}.serve", "--model", "tiny-llama", "--port", str(port),
           "--log-level", "warning", "--engine-options", "device=cpu,dtype=float32,kv_cache_bytes=1048576"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": os.getcwd()})
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, err


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)                       # not up yet, or up but not healthy (503)
    pytest.fail(f"the server did not come up (exit code {proc.poll()})")


def children(pid: int) -> dict[int, bytes]:
    """The processes whose parent is `pid`, with their command lines."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue                                # gone meanwhile
        if ppid == pid:
            found[int(stat.parent.name)] = cmdline
    return found


def engine_pid(server_pid: int) -> int:
    """The server's engine process: the one child of multiprocessing's fork server, itself the
    server's child (beside the resource tracker)."""
    servers = [pid for pid, cmdline in children(server_pid).items() if b"forkserver" in cmdline]
    engines = [pid for server in servers for pid in children(server)]
    assert len(engines) == 1, f"not one engine process under the server {server_pid}: {engines}"
    return engines[0]


def test_server_exits_when_its_engine_dies(served):
    """No zombie server: the engine process killed, the server exits with status 1 within seconds.
    It ends the module's server, so it is this file's last test that uses it."""
    os.kill(engine_pid(served.proc.pid), signal.SIGKILL)
    assert served.proc.wait(timeout=30) == 1
