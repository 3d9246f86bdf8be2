"""The serving benchmark client against a fake OpenAI-compatible server (no model, CPU, seconds).

The fake streams max_tokens chunks, the first after FIRST_DELAY_S and the rest GAP_S apart, then a
usage chunk and [DONE], so every latency the client measures has a known value. The prompt's first
token id picks a misbehaviour (HTTP 400, a stream cut mid-way, ...). It counts streams in flight.
"""
from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse

from common import serving_client as sc

FIRST_DELAY_S = 0.05
GAP_S = 0.01
REJECT, CUT, NO_DONE, WRONG_USAGE, NO_USAGE = 9001, 9002, 9003, 9004, 9005
MODEL = "fake-model"


# --- the fake server ------------------------------------------------------------------------------
class FakeState:
    def __init__(self):
        self.reset()

    def reset(self, first_delay: float = FIRST_DELAY_S, gap: float = GAP_S) -> None:
        self.first_delay, self.gap = first_delay, gap
        self.in_flight = self.max_in_flight = 0
        self.bodies = []


def token_chunk(i: int) -> dict:
    # every other token completes no character: its text is empty, and it is still a token
    return {"id": "cmpl-0", "object": "text_completion", "model": MODEL, "usage": None,
            "choices": [{"index": 0, "text": "" if i % 2 else "a", "finish_reason": None}]}


def usage_chunk(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"id": "cmpl-0", "object": "text_completion", "model": MODEL, "choices": [],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


async def fake_events(state: FakeState, prompt: list[int], n: int):
    kind = prompt[0]
    state.in_flight += 1
    state.max_in_flight = max(state.max_in_flight, state.in_flight)
    try:
        await asyncio.sleep(state.first_delay)
        for i in range(n):
            if i:
                await asyncio.sleep(state.gap)
            if kind == CUT and i == 2:
                raise RuntimeError("the fake drops this stream")   # the server closes the connection
            yield {"data": json.dumps(token_chunk(i))}
        if kind != NO_USAGE:
            yield {"data": json.dumps(usage_chunk(len(prompt), n + (kind == WRONG_USAGE)))}
        if kind != NO_DONE:
            yield {"data": "[DONE]"}
    finally:
        state.in_flight -= 1


def fake_app(state: FakeState) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        state.bodies.append(body)
        if body["prompt"][0] == REJECT:
            return JSONResponse({"error": {"message": "bad prompt", "type": "invalid_request_error"}},
                                status_code=400)
        return EventSourceResponse(fake_events(state, body["prompt"], body["max_tokens"]))

    return app


class BackgroundServer:
    """uvicorn on a free port of 127.0.0.1, in a thread with its own event loop."""

    def __init__(self, app: FastAPI):
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the fake server did not start"
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def fake():
    state = FakeState()
    with BackgroundServer(fake_app(state)) as url:
        assert asyncio.run(sc.warm_up(url, MODEL)).ok    # as the command does before measuring
        yield url, state


@pytest.fixture
def server(fake):
    url, state = fake
    state.reset()
    return url, state


def run(url: str, requests, **kw):
    return asyncio.run(sc.run(url, MODEL, requests, **kw))


# --- one request ----------------------------------------------------------------------------------
def test_tokens_ttft_and_itl(server):
    url, state = server
    results, _ = run(url, [([1, 2, 3], 6)])
    r = results[0]
    assert r.ok and r.completion_tokens == 6 and len(r.token_times) == 6 and r.prompt_tokens == 3
    assert not r.count_mismatch
    # lower bounds are the fake's sleeps; upper bounds leave room for a busy machine
    assert FIRST_DELAY_S <= r.ttft < FIRST_DELAY_S + 0.1
    assert len(r.itls) == 5 and GAP_S * 0.8 <= statistics.median(r.itls) < GAP_S + 0.05
    assert r.tpot == pytest.approx((r.e2e - r.ttft) / 5)
    body = state.bodies[0]
    assert body["stream"] and body["ignore_eos"] and body["temperature"] == 0
    assert body["stream_options"] == {"include_usage": True} and body["model"] == MODEL


def test_token_count_without_usage_and_with_a_wrong_one(server):
    url, _ = server
    (no_usage, wrong), _ = run(url, [([NO_USAGE, 1], 4), ([WRONG_USAGE, 1], 4)])
    assert no_usage.ok and no_usage.completion_tokens == 4 and not no_usage.count_mismatch
    assert wrong.ok and wrong.completion_tokens == 5 and wrong.count_mismatch
    assert sc.summarize([no_usage, wrong], 1.0)["count_mismatches"] == 1


def test_failures_are_counted_and_do_not_stop_the_run(server):
    url, _ = server
    requests = [([1], 4), ([REJECT], 4), ([CUT], 6), ([NO_DONE], 3), ([2], 4)]
    results, wall_s = run(url, requests)
    assert [r.ok for r in results] == [True, False, False, False, True]
    assert results[1].error.startswith("HTTP 400") and "bad prompt" in results[1].error
    assert "RemoteProtocolError" in results[2].error and len(results[2].token_times) == 2
    assert "[DONE]" in results[3].error
    m = sc.summarize(results, wall_s)
    assert m["completed"] == 2 and m["failed"] == 3


def test_connection_refused_is_an_error_not_an_exception():
    results, _ = asyncio.run(sc.run("http://127.0.0.1:1", MODEL, [([1], 2)], timeout=2))
    assert not results[0].ok and "ConnectError" in results[0].error


# --- arrivals -------------------------------------------------------------------------------------
def test_fixed_concurrency_never_exceeds_the_limit(server):
    url, state = server
    state.reset(first_delay=0.01, gap=0.005)
    results, wall_s = run(url, [([i], 5) for i in range(12)], concurrency=3)
    assert all(r.ok for r in results)
    assert state.max_in_flight == 3
    assert sc.summarize(results, wall_s)["mean_in_flight"] <= 3


def test_poisson_arrival_times_are_seeded_with_the_right_mean():
    times = sc.arrival_times(2000, rate=50.0, seed=0)
    assert times == sc.arrival_times(2000, rate=50.0, seed=0) != sc.arrival_times(2000, 50.0, seed=1)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 0 and statistics.mean(gaps) == pytest.approx(1 / 50, rel=0.1)
    assert sc.arrival_times(3, None) == sc.arrival_times(3, float("inf")) == [0.0, 0.0, 0.0]


def test_requests_are_sent_on_the_poisson_schedule(server):
    url, state = server
    state.reset(first_delay=0.0, gap=0.0)
    rate, n = 25.0, 25
    results, wall_s = run(url, [([i], 2) for i in range(n)], rate=rate, seed=3)
    starts = sorted(r.start for r in results)
    planned = sc.arrival_times(n, rate, seed=3)
    sent_gap = statistics.mean(b - a for a, b in zip(starts, starts[1:]))
    planned_gap = statistics.mean(b - a for a, b in zip(planned, planned[1:]))
    # loose: a busy machine delays some sends; 24 gaps of a seeded draw are near, not at, 1 / rate
    assert sent_gap == pytest.approx(planned_gap, rel=0.5)
    assert planned_gap == pytest.approx(1 / rate, rel=0.35)
    assert wall_s >= planned[-1]


# --- metrics --------------------------------------------------------------------------------------
def test_percentile_is_linear_between_ranks():
    values = list(range(1, 102))          # 1..101: the q-th percentile is q + 1
    assert [sc.percentile(values, q) for q in (0, 50, 90, 99, 100)] == [1, 51, 91, 100, 101]
    assert sc.percentile([4.0, 1.0], 50) == 2.5 and sc.percentile([7.0], 99) == 7.0
    assert sc.percentile([], 50) is None


def hand_made(ttft_ms: float, itl_ms: float, tokens: int, error: str | None = None) -> sc.RequestResult:
    """A request sent at t=10 s, its tokens ttft then itl apart, done at the last token."""
    start = 10.0
    times = [start + (ttft_ms + i * itl_ms) / 1e3 for i in range(tokens)]
    return sc.RequestResult(prompt_tokens=100, max_tokens=tokens, start=start, end=times[-1],
                            token_times=times, completion_tokens=tokens, error=error)


def test_summarize_gives_known_percentiles_and_rates():
    # five completed requests with TTFT 10..50 ms and ITL 1..5 ms, 11 tokens each; one failed
    results = [hand_made(10 * k, k, 11) for k in range(1, 6)] + [hand_made(500, 0, 1, error="HTTP 500")]
    m = sc.summarize(results, wall_s=2.0)
    expected = {"ttft_ms": (30, 46, 49.6), "itl_ms": (3, 5, 5), "tpot_ms": (3, 4.6, 4.96),
                "e2e_ms": (60, 92, 99.2)}        # e2e = ttft + 10 * itl = 20 * k ms
    for name, (p50, p90, p99) in expected.items():
        got = [m[f"{name}_p{q}"] for q in (50, 90, 99)]
        assert got == pytest.approx([p50, p90, p99], abs=1e-6), name
    assert m["completed"] == 5 and m["failed"] == 1 and m["count_mismatches"] == 0 and m["short_outputs"] == 0
    assert m["request_throughput"] == 2.5
    assert m["output_tok_s"] == pytest.approx(55 / 2) and m["total_tok_s"] == pytest.approx(555 / 2)
    # the failed request was in flight for 500 ms too: (20 + 40 + 60 + 80 + 100 + 500) ms / 2 s
    assert m["mean_in_flight"] == pytest.approx((0.3 + 0.5) / 2)


def test_summarize_with_no_completed_request():
    m = sc.summarize([hand_made(5, 1, 1, error="broken")], wall_s=1.0)
    assert m["completed"] == 0 and m["failed"] == 1 and m["ttft_ms_p50"] is None and m["output_tok_s"] == 0


# --- the command ----------------------------------------------------------------------------------
def test_cli_prints_a_line_per_setting_and_writes_json(server, tmp_path, capsys):
    url, state = server
    state.reset(first_delay=0.0, gap=0.0005)
    out = tmp_path / "serving.json"
    records = sc.main(["--url", url, "--model", MODEL, "--concurrency", "1,2", "--rate", "inf",
                       "--scale", "small", "--requests", "3", "--out", str(out)])
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[serving]")]
    assert len(lines) == 2 and "concurrency=1" in lines[0] and "concurrency=2" in lines[1]
    saved = json.loads(out.read_text())
    assert [r["setting"] for r in saved] == [{"concurrency": 1, "requests": 3}, {"concurrency": 2, "requests": 3}]
    assert all(r["metrics"]["completed"] == 3 and r["metrics"]["failed"] == 0 for r in records)
    assert saved[0]["metrics"]["output_tok_s"] > 0 and len(saved[0]["samples"]) == 3
