"""A serving benchmark client: streams requests to an OpenAI-compatible server's /v1/completions
and measures what the server's users see (the `serving` workload).

Per request, on this client's clock (time.perf_counter, seconds):
  TTFT   request sent -> first chunk that carries a token
  ITL    the gap between two consecutive token chunks (every gap of every request)
  TPOT   (e2e - TTFT) / (tokens - 1): the mean time per output token after the first
  e2e    request sent -> [DONE]
A chunk with a `choices` entry is one token, whatever its text: a token that does not complete a
character streams as an empty string. The token count is the server's usage when it sends one.

Requests go out at fixed concurrency (at most N in flight), as Poisson arrivals at a rate, or
both (arrivals at a rate, held by the client while N are in flight). A request's clock starts when
it is sent, so time queued in this client is in no metric; time queued in the server is in TTFT.

    python -m common.serving_client --url http://127.0.0.1:8000 --model NAME --concurrency 1,8,64
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from . import workloads

Request = tuple[list[int] | str, int]     # (prompt token ids or text, max_tokens)

COMPLETIONS_PATH = "/v1/completions"
READ_TIMEOUT_S = 3600.0    # longest silence accepted on a stream: a request queued behind many may wait
CONNECT_TIMEOUT_S = 30.0
PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    """One request as the client saw it; times are time.perf_counter seconds."""
    prompt_tokens: int                 # the server's usage count when sent, else len(prompt ids)
    max_tokens: int
    start: float = 0.0                 # request sent
    end: float = 0.0                   # [DONE] received, or the request failed
    token_times: list[float] = field(default_factory=list)   # arrival of each token chunk
    completion_tokens: int = 0         # the server's usage count when sent, else the token chunks
    token_ids: list[int] = field(default_factory=list)       # when the server returns them
    count_mismatch: bool = False       # usage and the token chunks counted disagree
    error: str | None = None           # why the request failed; None when it completed

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def tpot(self) -> float | None:
        """Undefined for one token: there is no time after the first."""
        if self.ttft is None or self.completion_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)


# --- one request ----------------------------------------------------------------------------------
def completions_url(url: str) -> str:
    """The server's base URL (http://host:port) or the endpoint itself."""
    url = url.rstrip("/")
    return url if url.endswith(COMPLETIONS_PATH) else url + COMPLETIONS_PATH


def request_body(model: str, prompt: list[int] | str, max_tokens: int) -> dict:
    """Greedy, exactly max_tokens tokens, usage in the last chunk; ignore_eos and return_token_ids
    are vLLM's extensions (a server without them ignores them)."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True, "stream": True, "stream_options": {"include_usage": True}}


async def send(client: httpx.AsyncClient, url: str, model: str, prompt_ids: list[int] | str,
               max_tokens: int) -> RequestResult:
    """Stream one completion and time it. Never raises for a server's fault: a status other than
    200, a connection refused or cut, a malformed chunk or a missing [DONE] becomes result.error."""
    result = RequestResult(prompt_tokens=0 if isinstance(prompt_ids, str) else len(prompt_ids),
                           max_tokens=max_tokens)
    body = request_body(model, prompt_ids, max_tokens)
    result.start = time.perf_counter()
    try:
        async with client.stream("POST", completions_url(url), json=body) as response:
            if response.status_code != 200:
                result.error = await http_error(response)
            else:
                result.error = await read_stream(response, result)
    except (httpx.HTTPError, ValueError) as e:    # ValueError: a chunk that is not JSON
        result.error = f"{type(e).__name__}: {e}"
    if not result.ok:
        result.end = time.perf_counter()
    return result


async def http_error(response: httpx.Response) -> str:
    text = (await response.aread()).decode(errors="replace")
    return f"HTTP {response.status_code}: {text[:200]}"


async def read_stream(response: httpx.Response, result: RequestResult) -> str | None:
    """Read the server-sent events into result; returns an error string, or None when [DONE] came.
    Reads on past [DONE] to the end of the body, so that the connection goes back to the pool."""
    chunks, usage, done = 0, None, False
    async for line in response.aiter_lines():
        now = time.perf_counter()
        if done or not line.startswith("data:"):
            continue      # blank separators, ": ping" comments, event:/id: fields
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            result.end, done = now, True
            continue
        chunk = json.loads(payload)
        if not isinstance(chunk, dict) or chunk.get("error"):
            return f"error event: {payload[:200]}"
        if chunk.get("choices"):
            result.token_times.append(now)
            result.token_ids += chunk["choices"][0].get("token_ids") or []
            chunks += 1
        usage = chunk.get("usage") or usage    # null on every chunk but the last
    count_tokens(result, chunks, usage)
    return None if done else "stream ended without [DONE]"


def count_tokens(result: RequestResult, chunks: int, usage: dict | None) -> None:
    result.completion_tokens = chunks
    if usage:
        result.completion_tokens = usage.get("completion_tokens", chunks)
        result.prompt_tokens = usage.get("prompt_tokens", result.prompt_tokens)
        result.count_mismatch = result.completion_tokens != chunks


# --- a run of many --------------------------------------------------------------------------------
def arrival_times(n: int, rate: float | None, seed: int = 0) -> list[float]:
    """Seconds after the start at which each of n requests is sent: a Poisson process at `rate`
    requests/s (exponential gaps, the first at 0), or all at 0 for rate None or inf."""
    if rate is None or math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    times = [0.0]
    for _ in range(n - 1):
        times.append(times[-1] + rng.expovariate(rate))
    return times[:n]


def make_client(limit: int, timeout: float) -> httpx.AsyncClient:
    # One connection per stream in flight (HTTP/1.1 carries one response at a time), kept alive so
    # that the next request's TTFT holds no TCP handshake. pool=None: a request never times out
    # waiting for a connection (there are as many as requests in flight). trust_env=False: no
    # proxy from the environment between this client and the server it measures.
    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    timeouts = httpx.Timeout(timeout, connect=CONNECT_TIMEOUT_S, pool=None)
    return httpx.AsyncClient(limits=limits, timeout=timeouts, trust_env=False)


async def run(url: str, model: str, requests: list[Request], *, concurrency: int | None = None,
              rate: float | None = None, seed: int = 0,
              timeout: float = READ_TIMEOUT_S) -> tuple[list[RequestResult], float]:
    """Send every request, at most `concurrency` in flight (None: no limit), arriving as a
    Poisson process at `rate` requests/s (None or inf: all at t=0). Returns the results in the
    order of `requests` and the wall time in seconds, from the first arrival to the last [DONE]."""
    if not requests or (concurrency is not None and concurrency < 1) or (rate is not None and not rate > 0):
        raise ValueError(f"run() needs requests, concurrency >= 1 and rate > 0, got {len(requests)} "
                         f"requests, {concurrency}, {rate}")
    limit = concurrency or len(requests)
    gate = asyncio.Semaphore(limit)
    arrivals = arrival_times(len(requests), rate, seed)
    async with make_client(limit, timeout) as client:
        t0 = time.perf_counter()

        async def arrive(request: Request, at: float) -> RequestResult:
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            async with gate:
                return await send(client, url, model, *request)

        results = await asyncio.gather(*(arrive(r, at) for r, at in zip(requests, arrivals)))
        wall_s = time.perf_counter() - t0
    return list(results), wall_s


async def warm_up(url: str, model: str) -> RequestResult:
    """One short request before the clock runs: it tells whether the server answers at all, and
    it pays this process's one-off costs (the HTTP stack's lazy imports and set-up, tens of ms)
    that would otherwise land in the first measured request's TTFT and delay the next arrivals."""
    results, _ = await run(url, model, [([1, 2, 3, 4], 4)])
    return results[0]


def requests_of(work: workloads.Workload) -> list[Request]:
    """A benchmark workload's (prompt ids, SamplingParams) pairs as (prompt ids, max_tokens)."""
    return [(ids, params.max_tokens) for ids, params in work.requests]


# --- metrics --------------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between the two nearest ranks (numpy's default
    method): position (n - 1) * q / 100 in the sorted values. None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def add_percentiles(metrics: dict, name: str, values: list[float]) -> None:
    for q in PERCENTILES:
        metrics[f"{name}_p{q}"] = percentile(values, q)


def summarize(results: list[RequestResult], wall_s: float) -> dict:
    """The metrics of a run (latencies of completed requests only; a failed one counts in `failed`
    and in mean_in_flight, the requests in flight on average: Little's law, sum of e2e / wall).
    short_outputs: completed requests with fewer tokens than max_tokens, from a server that ignored
    ignore_eos (its throughput is then not comparable); count_mismatches: usage != token chunks."""
    ok = [r for r in results if r.ok]
    metrics = {}
    add_percentiles(metrics, "ttft_ms", [1e3 * r.ttft for r in ok if r.ttft is not None])
    add_percentiles(metrics, "tpot_ms", [1e3 * r.tpot for r in ok if r.tpot is not None])
    add_percentiles(metrics, "itl_ms", [1e3 * gap for r in ok for gap in r.itls])
    add_percentiles(metrics, "e2e_ms", [1e3 * r.e2e for r in ok])
    out_tokens = sum(r.completion_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    metrics.update({
        "request_throughput": len(ok) / wall_s, "output_tok_s": out_tokens / wall_s,
        "total_tok_s": (in_tokens + out_tokens) / wall_s, "completed": len(ok),
        "failed": len(results) - len(ok), "count_mismatches": sum(r.count_mismatch for r in ok),
        "short_outputs": sum(r.completion_tokens < r.max_tokens for r in ok),
        "mean_in_flight": sum(r.e2e for r in results) / wall_s, "wall_s": wall_s})
    return metrics


# --- the command ----------------------------------------------------------------------------------
def make_requests(args, concurrency: int | None) -> list[Request]:
    """The concurrency workload holds as many requests as the level (each then in flight at once);
    --requests overrides the count of either workload."""
    if args.workload == "offline":
        return requests_of(workloads.offline(args.scale, seed=args.seed, num_requests=args.requests))
    n = args.requests or concurrency or workloads.OFFLINE_REQUESTS[args.scale]   # rate only: the offline count
    return requests_of(workloads.concurrency(n, args.scale, seed=args.seed))


def standard_line(setting: dict, m: dict) -> str:
    def ms(name: str) -> str:
        return "/".join("-" if m[f"{name}_p{q}"] is None else f"{m[f'{name}_p{q}']:.1f}" for q in PERCENTILES)
    where = " ".join(f"{k}={v}" for k, v in setting.items())
    return (f"[serving] {where}: {m['completed']} ok {m['failed']} failed  {m['request_throughput']:.2f} req/s  "
            f"{m['output_tok_s']:.1f} out tok/s  {m['total_tok_s']:.1f} total tok/s  "
            f"TTFT {ms('ttft_ms')}  TPOT {ms('tpot_ms')}  ITL {ms('itl_ms')} ms (p50/p90/p99)  "
            f"in flight {m['mean_in_flight']:.1f}")


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    check = asyncio.run(warm_up(args.url, args.model))
    if not check.ok:   # the server is down or refuses this model: say so once, not once per request
        sys.exit(f"[serving] a first request to {args.url} failed: {check.error}")
    records = []
    for concurrency in args.concurrency or [None]:
        for rate in args.rate:
            requests = make_requests(args, concurrency)
            results, wall_s = asyncio.run(run(args.url, args.model, requests, concurrency=concurrency,
                                              rate=rate, seed=args.seed))
            setting = {k: v for k, v in [("concurrency", concurrency), ("rate", rate),
                                         ("requests", len(requests))] if v is not None}
            records.append(record(args, setting, summarize(results, wall_s), results))
            print(standard_line(setting, records[-1]["metrics"]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(records, indent=1, allow_nan=False) + "\n")
    return records


def record(args, setting: dict, metrics: dict, results: list[RequestResult]) -> dict:
    """One setting's result, with each request's raw numbers (no per-token times: they can be long)."""
    samples = [{"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
                "ttft_ms": None if r.ttft is None else 1e3 * r.ttft, "e2e_ms": 1e3 * r.e2e,
                "error": r.error} for r in results]
    return {"workload": "serving", "requests_from": args.workload, "scale": args.scale,
            "url": args.url, "model": args.model, "setting": setting, "metrics": metrics,
            "samples": samples, "provenance": {"command": " ".join(["python", *sys.argv]),
            "utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (or its /v1/completions)")
    p.add_argument("--model", required=True, help="the model name the server serves")
    p.add_argument("--concurrency", default=None, help="comma-separated levels, e.g. 1,8,64 (default: no limit)")
    p.add_argument("--rate", default=None, help="comma-separated Poisson rates in requests/s; inf = all at once")
    p.add_argument("--requests", type=int, default=None, help="requests per setting (default: the workload's)")
    p.add_argument("--workload", choices=["concurrency", "offline"], default="concurrency",
                   help="where the prompts and lengths come from (common/workloads.py)")
    p.add_argument("--scale", choices=["full", "small"], default="full")
    p.add_argument("--seed", type=int, default=0, help="prompts and arrival times")
    p.add_argument("--out", type=Path, default=None, help="write the records as JSON here")
    args = p.parse_args(argv)
    try:
        args.concurrency = parse_list(args.concurrency, int)
        # inf is "all at once", the same as no rate; None also keeps inf out of the JSON
        rates = parse_list(args.rate, float) or [math.inf]
        args.rate = [None if math.isinf(r) else r for r in rates]
    except ValueError as e:
        p.error(str(e))
    if any(c < 1 for c in args.concurrency or []) or any(r is not None and r <= 0 for r in args.rate) \
            or (args.requests is not None and args.requests < 1):
        p.error("--concurrency levels, --rate and --requests must be positive")
    return args


def parse_list(text: str | None, kind: type) -> list | None:
    """"1,8,64" -> [1, 8, 64]; None stays None."""
    return None if text is None else [kind(x) for x in text.split(",")]


if __name__ == "__main__":
    main()
