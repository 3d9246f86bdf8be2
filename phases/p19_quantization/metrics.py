"""ServerMetrics: what `GET /metrics` reports, in Prometheus' text format.

Gauges come from the engine loop (sent with every step): requests running, waiting and swapped
out, KV blocks used and free, and the prefix cache's counts (prompt tokens looked up and found,
their ratio the hit rate); once the engine process is dead they are left out. Counters and
histograms are kept here, on the event loop, from the deltas the server streams: tokens
generated, prompt tokens, finished requests by reason, time to first token and inter-token
latency. Where vLLM has the metric the name is vLLM's with `mini_infer:` for `vllm:`; the
`kv_blocks_*` gauges and `num_requests_swapped` are this engine's own, and no series carries a
`model_name` label, so a vLLM dashboard's queries need adapting.
"""
from __future__ import annotations

from bisect import bisect_left

PREFIX = "mini_infer:"
# Bucket upper bounds in seconds; the last bucket (+Inf) is implicit.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)
# Speculative decoding's counters (speculator.py), sent with the gauges: vLLM's names.
SPEC_COUNTERS = {"spec_decode_num_drafts": "Sequence-steps that verified drafted tokens.",
                 "spec_decode_num_draft_tokens": "Drafted tokens verified.",
                 "spec_decode_num_accepted_tokens": "Drafted tokens the target accepted."}


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)     # per bucket, not cumulative; the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value

    def lines(self, name: str) -> list[str]:
        out, total = [], 0
        for bound, count in zip([*map(str, self.buckets), "+Inf"], self.counts):
            total += count
            out.append(f'{name}_bucket{{le="{bound}"}} {total}')
        return out + [f"{name}_sum {self.sum}", f"{name}_count {total}"]


class ServerMetrics:
    def __init__(self, engine):
        self.engine = engine                       # AsyncLLM: its gauges and limits
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.finished: dict[str, int] = {}         # finish_reason -> requests
        engine.observers.append(self.observe)

    def observe(self, req, delta) -> None:
        """One delta of one request (on the event loop)."""
        times = delta.token_times
        if times:
            prev = req.last_token_time             # kept on the request: nothing here to free
            if prev is None:
                self.ttft.observe(times[0] - req.arrival)
                self.prompt_tokens += len(req.prompt_ids)
            for a, b in zip([prev, *times], times):
                if a is not None:
                    self.itl.observe(b - a)
            req.last_token_time = times[-1]
            self.generation_tokens += len(times)
        if delta.finish is not None:
            reason = delta.finish[0]
            self.finished[reason] = self.finished.get(reason, 0) + 1

    def render(self) -> str:
        g, blocks = self.engine.gauges, self.engine.limits["num_blocks"]
        lines = []

        def metric(name: str, kind: str, help_: str, values: list[str]) -> None:
            lines.extend([f"# HELP {PREFIX}{name} {help_}", f"# TYPE {PREFIX}{name} {kind}",
                          *[f"{PREFIX}{v}" for v in values]])
        if self.engine.alive:              # a dead engine's last gauges would be a lie: none then
            metric("num_requests_running", "gauge", "Requests in the running batch.", [f"num_requests_running {g['running']}"])
            metric("num_requests_waiting", "gauge", "Requests waiting to be admitted.", [f"num_requests_waiting {g['waiting']}"])
            metric("num_requests_swapped", "gauge", "Requests preempted to host memory.", [f"num_requests_swapped {g['swapped']}"])
            metric("kv_blocks_free", "gauge", "Free KV cache blocks.", [f"kv_blocks_free {g['kv_blocks_free']}"])
            metric("kv_blocks_used", "gauge", "KV cache blocks held by requests.", [f"kv_blocks_used {blocks - g['kv_blocks_free']}"])
            metric("num_preemptions_total", "counter", "Preemptions since start.", [f"num_preemptions_total {g['preemptions']}"])
            metric("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
                   [f"prefix_cache_queries_total {g['cache_queries']}"])
            metric("prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
                   [f"prefix_cache_hits_total {g['cache_hits']}"])
            metric("prefix_cache_hit_rate", "gauge", "Prefix cache hits over queries since start.",
                   [f"prefix_cache_hit_rate {g['cache_hits'] / max(1, g['cache_queries'])}"])
        if "spec_decode_num_drafts" in g:  # speculative decoding (vLLM's names, counted by speculator.py)
            for name, help_ in SPEC_COUNTERS.items():
                metric(f"{name}_total", "counter", help_, [f"{name}_total {g[name]}"])
            name = "spec_decode_num_accepted_tokens_per_pos"
            metric(f"{name}_total", "counter", "Accepted tokens by draft position.",
                   [f'{name}_total{{position="{j}"}} {n}' for j, n in enumerate(g[name])])
        metric("prompt_tokens_total", "counter", "Prompt tokens of requests that produced a token.",
               [f"prompt_tokens_total {self.prompt_tokens}"])
        metric("generation_tokens_total", "counter", "Tokens generated.", [f"generation_tokens_total {self.generation_tokens}"])
        metric("request_success_total", "counter", "Finished requests by finish reason.",
               [f'request_success_total{{finished_reason="{r}"}} {n}' for r, n in sorted(self.finished.items())])
        metric("time_to_first_token_seconds", "histogram", "Arrival to first token.",
               self.ttft.lines("time_to_first_token_seconds"))
        metric("inter_token_latency_seconds", "histogram", "Gap between consecutive tokens of a request.",
               self.itl.lines("inter_token_latency_seconds"))
        return "\n".join(lines) + "\n"
