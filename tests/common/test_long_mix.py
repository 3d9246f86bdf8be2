"""The long-mix workload: seeded Poisson arrivals inside the window, streams kept full (closed
loop), long prompts' TTFT from their scheduled arrival, percentiles as numpy computes them."""
import dataclasses
import time

import pytest

from common import long_mix
from common.output import Output

MIX = long_mix.Mix(streams=3, short_prompt=4, short_output=2, long_lo=8, long_hi=12, long_output=2,
                   rate=20.0, window_s=0.5)


class FakeEngine:
    """The step API over a clock: each step gives every request one token (a long prompt's first
    token takes `long_steps` steps); step() returns (id, Output) of those it finished."""

    def __init__(self, step_s: float = 0.005, long_steps: int = 3):
        self.step_s, self.long_steps, self.live, self.ids, self.added = step_s, long_steps, {}, 0, []

    def add_request(self, prompt, params):
        self.ids += 1
        self.added.append((self.ids, len(prompt), time.perf_counter()))
        wait = self.long_steps if len(prompt) >= MIX.long_lo else 1
        self.live[self.ids] = [prompt, params.max_tokens, wait, time.perf_counter(), []]
        return self.ids

    def has_unfinished(self):
        return bool(self.live)

    def step(self):
        time.sleep(self.step_s)
        done = []
        for rid, req in list(self.live.items()):
            req[2] -= 1
            if req[2] <= 0:
                req[4].append(time.perf_counter())
            if len(req[4]) == req[1]:
                done.append((rid, Output(req[0], [7] * req[1], "", "length", req[3], req[4])))
                del self.live[rid]
        return done


def test_arrivals_are_seeded_poisson_inside_the_window():
    arrivals = MIX.long_arrivals()
    assert arrivals == MIX.long_arrivals()                      # every engine gets the same requests
    times = [t for t, _ in arrivals]
    assert times == sorted(times) and all(0 < t < MIX.window_s for t in times)
    assert all(MIX.long_lo <= len(ids) <= MIX.long_hi for _, ids in arrivals)
    many = long_mix.Mix(1, 1, 1, 1, 1, 1, rate=50.0, window_s=100.0).long_arrivals()
    assert len(many) == pytest.approx(5000, rel=0.05)          # rate x window


def test_sample_keeps_the_streams_full_and_measures_every_request():
    engine = FakeEngine()
    m = long_mix.sample(engine, MIX, "cpu")
    shorts = [a for a in engine.added if a[1] == MIX.short_prompt]
    assert m["num_long"] == len(MIX.long_arrivals()) > 0
    assert m["num_short"] == len(shorts) > MIX.streams          # finished streams sent their next request
    assert not engine.live                                       # the sample ends with every request done
    assert m["output_tok_s"] > 0 and m["itl_p50_ms"] <= m["itl_p99_ms"] <= m["itl_max_ms"]
    assert m["ttft_long_p50_ms"] > m["ttft_short_p50_ms"]       # 3 steps to a long prompt's first token
    assert "num_preemptions" not in m                            # an engine without a preemption count


def test_sample_counts_the_preemptions_of_its_own_run():
    engine = FakeEngine()
    engine.scheduler = type("Scheduler", (), {"num_preemptions": 5})()
    step = engine.step

    def preempting_step():                                      # two preemptions over the run
        if engine.scheduler.num_preemptions < 7:
            engine.scheduler.num_preemptions += 1
        return step()
    engine.step = preempting_step
    assert long_mix.sample(engine, MIX, "cpu")["num_preemptions"] == 2


def test_long_ttft_counts_from_the_scheduled_arrival():
    """A step that holds up a long prompt's submission is part of its TTFT."""
    out = Output([1], [7], "", "length", arrival_time=10.2, token_times=[10.5])
    m = long_mix.metrics({1: out, 2: Output([1], [7, 7], "", "length", 10.0, [10.1, 10.2])},
                         {1: "long", 2: "short"}, {1: 10.0}, wall=1.0)
    assert m["ttft_long_p50_ms"] == pytest.approx(500) and m["ttft_short_p50_ms"] == pytest.approx(100)
    assert m["output_tok_s"] == 3 and m["itl_p50_ms"] == pytest.approx(100)


def test_percentile_interpolates_like_numpy():
    assert long_mix.percentile([1, 2, 3, 4], 50) == 2.5
    assert long_mix.percentile(list(range(101)), 99) == 99
    assert long_mix.percentile([5], 99) == 5


def test_mix_for_scales_and_presets():
    assert long_mix.mix_for("anything", "small") == long_mix.MIXES["small", "small"]
    assert long_mix.mix_for("llama-8b", "full").streams == 16
    with pytest.raises(ValueError, match="no full-scale long-mix"):
        long_mix.mix_for("tiny-llama", "full")


def fake_record(engine: str, budget: int | None, part: str, run: str, utc: str, itl_p99: float) -> dict:
    """A long-mix record of two repeats: ITL p99 as given, every other metric 10."""
    keys = ("output_tok_s", "itl_p50_ms", "ttft_long_p50_ms", "ttft_short_p50_ms")
    metrics = {k: 10.0 for k in keys} | {"itl_p99_ms": itl_p99}
    return {"phase": "p11_x", "engine": engine, "workload": long_mix.WORKLOAD, "preset": "llama-8b",
            "device": long_mix.GPU, "setting": {"max_num_batched_tokens": budget} if budget else {},
            "run_id": run, "part": part, "metrics": metrics, "samples": [{"repeat": i} | metrics for i in range(2)],
            "provenance": {"utc": utc, "git_sha": "a" * 40, "make_command": f"make phase-11 bench PART={part}"}}


def test_a_sweep_over_two_parts_shows_each_run_against_its_own_baseline():
    first = [fake_record("p10", None, "mix-a", "r1", "2026-01-01", 40.0), fake_record("p10#2", None, "mix-a", "r1", "2026-01-01", 40.0),
             fake_record("p11", 2048, "mix-a", "r1", "2026-01-01", 20.0)]
    second = [fake_record("p10", None, "mix-b", "r2", "2026-01-02", 80.0), fake_record("p10#2", None, "mix-b", "r2", "2026-01-02", 80.0),
              fake_record("p11", 1024, "mix-b", "r2", "2026-01-02", 20.0)]
    runs = long_mix.newest_runs(first + second, long_mix.GPU, "llama-8b")
    assert [[r["run_id"] for r in run] for run in runs] == [["r1"] * 3, ["r2"] * 3]
    text = long_mix.results_table(first + second)
    assert "| llama-8b (mix-a) | 2048 |" in text and "| llama-8b (mix-b) | 1024 |" in text
    assert "2.00×" in text and "4.00×" in text          # each budget over its own run's p10, never across runs
    assert "| p99/p50 |" in text and "| ITL p99 vs p10 | ITL p50 vs p10 |" in text   # the median beside the tail
    assert "PART=mix-a" in text and "PART=mix-b" in text


def test_file_option_names_the_result_file():
    args = long_mix.parse_args(["--phase", "p11_x", "--engines", "p10", "--file", "long-mix-8b-b", "--device", "cpu"])
    assert args.file == "long-mix-8b-b"
    assert long_mix.parse_args(["--phase", "p11_x", "--engines", "p10", "--device", "cpu"]).file == long_mix.WORKLOAD


def test_warm_up_runs_the_mix_itself_before_the_clock():
    """Besides the longest prompt, the warm-up runs the mix (streams decoding beside long prompts)
    for a short window: the steps a timed repeat takes, compiled and allocated before it."""
    engine = FakeEngine(step_s=0.001)
    engine.generate = lambda prompts, params: None           # the first, shape-only pass
    mix = long_mix.Mix(streams=2, short_prompt=4, short_output=2, long_lo=8, long_hi=12, long_output=2,
                       rate=50.0, window_s=100.0)
    long_mix.warm_up(engine, mix, "cpu")
    longs = [n for _, n, _ in engine.added if n >= mix.long_lo]
    assert longs and len(longs) == len(dataclasses.replace(mix, window_s=long_mix.WARM_UP_WINDOW_S).long_arrivals())
    assert not engine.has_unfinished()
