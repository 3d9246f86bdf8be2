"""ServedLLM: this phase's engine behind its own HTTP server, with the engine's generate() API.

The benchmark harness drives it exactly like the offline engine (the same workloads, interleaved
in one run), so the gap between "p09" and "p09 http" is the price of the HTTP layer: request
parsing, one SSE chunk per token, the hop between the engine process and the server. The server
runs as its own process (`python -m <phase>.serve`), as it would in production, and requests go
through the streaming benchmark client (common/serving_client.py), all in flight at once.
"""
from __future__ import annotations

import asyncio
import ctypes
import signal
import subprocess
import sys
import time
import weakref

import httpx

from common import serving_client
from common.output import Output
from common.requests import as_params_list, as_prompt_list

from .async_engine import START_TIMEOUT_S
from .parallel_state import free_port


class ServedLLM:
    runs_in_workers = True      # its GPU memory is another process's: the harness must not count it here

    def __init__(self, model: str, *, server: str = "http", detokenize: bool = False, **options):
        if server != "http":
            raise ValueError(f"server must be 'http', got {server!r}")
        self.model, port = model, free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", f"{__package__}.serve", "--model", model, "--port", str(port),
               "--log-level", "warning", "--engine-options", ",".join(f"{k}={v}" for k, v in options.items())]
        self.proc = subprocess.Popen(cmd, preexec_fn=die_with_parent)
        self._stop = weakref.finalize(self, stop, self.proc)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with code {self.proc.returncode} while starting")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the server was not ready after {START_TIMEOUT_S} s")

    def generate(self, prompts, sampling_params=None, use_tqdm: bool = False) -> list[Output]:
        """Every prompt as one streamed request, all in flight at once. The benchmark client sends
        greedy requests that ignore EOS: other sampling parameters are refused, not changed."""
        prompts = as_prompt_list(prompts)
        params = as_params_list(sampling_params, len(prompts))
        if any(p.temperature != 0 or not p.ignore_eos or p.stop for p in params):
            raise ValueError("ServedLLM.generate sends greedy requests that ignore EOS (the benchmark's)")
        requests = [(ids, p.max_tokens) for ids, p in zip(prompts, params)]
        results, _ = asyncio.run(serving_client.run(self.url, self.model, requests, concurrency=len(requests)))
        failed = [r.error for r in results if not r.ok]
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(results)} requests failed; first: {failed[0]}")
        return [Output(list(ids), r.token_ids, "", "length", r.start, r.token_times)
                for (ids, _), r in zip(requests, results)]

    def shutdown(self) -> None:
        self._stop()


def die_with_parent() -> None:
    """In the child, before exec: the kernel sends SIGTERM when its parent dies (Linux prctl
    PR_SET_PDEATHSIG), so a killed benchmark leaves no server behind."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)    # as Ctrl-C: uvicorn shuts down, then Python exits cleanly
                                           # (after SIGTERM uvicorn re-raises it: no exit handlers run)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
