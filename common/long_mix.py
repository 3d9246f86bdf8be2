"""The long-mix workload: steady decode streams plus Poisson arrivals of long
prompts, and its runner: what a long prefill does to the requests decoding beside it.

  python -m common.long_mix --phase p11_chunked_prefill --presets llama-1b \
      --engines "p10,p10#2,p11 max_num_batched_tokens=2048"
  python -m common.long_mix readme p11_chunked_prefill     # the README's generated headline and table

Streams: each of `streams` streams keeps one short request in flight (a `short_prompt`-token
prompt, `short_output` new tokens); when it finishes, the stream sends its next one at once (a
closed loop), so the engine always decodes about `streams` sequences. Long prompts: uniform in
[long_lo, long_hi] tokens, `long_output` new tokens each, arriving open-loop at Poisson times of
`rate` per second over `window_s` seconds. The streams stop sending at the window's end, and the
sample ends when every request has finished. Arrival times and token ids are seeded: every engine
and repeat gets the same requests at the same offsets.

One sample per engine and repeat: the inter-token latency (ITL) p50/p99 over every gap of every
request, the time to first token (TTFT) p50/p99 of the long prompts (from their scheduled
arrival, so a step that holds up their submission counts) and of the short ones, and output
tok/s over the sample's wall time. The engines of one call are built side by side and measured
interleaved and rotated, as common.bench does; an engine listed twice ("p10,p10#2") is the run's
A/A control.
"""
from __future__ import annotations

import dataclasses
import importlib
import random
import sys
import time
import uuid
from pathlib import Path

from tqdm import tqdm

from . import bench, measure, runner_args, stats
from .device import device_name, parse_dtype, synchronize
from .engines import make_engine
from .loader import resolve
from .report import engine_label, short_sha, table
from .results import RESULTS, device_tag, fill_readme_blocks, provenance, read_records, write_records
from .workloads import PROMPT_ID_RANGE, greedy

WORKLOAD = "long-mix"


@dataclasses.dataclass(frozen=True)
class Mix:
    streams: int           # short requests kept in flight (closed loop)
    short_prompt: int      # tokens per short prompt
    short_output: int      # new tokens per short request
    long_lo: int           # long prompt length, uniform in [long_lo, long_hi]
    long_hi: int
    long_output: int       # new tokens per long request
    rate: float            # long prompts per second (Poisson)
    window_s: float        # streams send and long prompts arrive during this many seconds
    seed: int = 0

    def long_arrivals(self) -> list[tuple[float, list[int]]]:
        """(offset in seconds, prompt ids) of every long prompt: exponential gaps of mean 1/rate."""
        rng, out, t = random.Random(self.seed), [], 0.0
        while True:
            t += rng.expovariate(self.rate)
            if t >= self.window_s:
                return out
            out.append((t, [rng.randrange(PROMPT_ID_RANGE) for _ in range(rng.randint(self.long_lo, self.long_hi))]))

    def kv_tokens(self, block_size: int = 16, longs_in_flight: int = 6) -> int:
        """KV slots that hold every stream and a few long prompts at once (more wait or preempt)."""
        short = self.short_prompt + self.short_output + block_size
        return self.streams * short + longs_in_flight * (self.long_hi + self.long_output + block_size)


# The sizes on the GPU: 32 streams on llama-1b, 16 on llama-8b, long prompts of 4k-8k
# tokens; a CPU keeps the shape at small scale (tiny-llama, prompts of 128-256).
MIXES = {
    ("llama-1b", "full"): Mix(32, 256, 256, 4096, 8000, 32, rate=2.0, window_s=6.0),
    ("llama-8b", "full"): Mix(16, 256, 256, 4096, 8000, 32, rate=2.0, window_s=8.0),
    ("small", "small"): Mix(4, 16, 16, 128, 256, 4, rate=2.0, window_s=2.0),
}
REPEATS = {"full": 3, "small": 3}


def mix_for(preset: str, scale: str) -> Mix:
    """The small mix on any preset; at full scale the preset's own."""
    if scale == "small":
        return MIXES["small", "small"]
    if (preset, scale) not in MIXES:
        raise ValueError(f"no full-scale long-mix for {preset!r}: one of {[p for p, s in MIXES if s == 'full']}, "
                         f"or --scale small")
    return MIXES[preset, scale]


# --- one sample ---------------------------------------------------------------------------------
def sample(engine, mix: Mix, device: str) -> dict:
    """Run the mix once on an idle engine (its step API); the sample's metrics."""
    rng, longs = random.Random(mix.seed + 1), mix.long_arrivals()
    short_ids = lambda: [rng.randrange(PROMPT_ID_RANGE) for _ in range(mix.short_prompt)]   # noqa: E731
    kinds, scheduled, outputs = {}, {}, {}
    preempted = measure.preemptions(engine)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(mix.streams):
        kinds[engine.add_request(short_ids(), greedy(mix.short_output))] = "short"
    sent = 0
    while sent < len(longs) or engine.has_unfinished():
        now = time.perf_counter() - start
        while sent < len(longs) and longs[sent][0] <= now:
            rid = engine.add_request(longs[sent][1], greedy(mix.long_output))
            kinds[rid], scheduled[rid], sent = "long", start + longs[sent][0], sent + 1
        if not engine.has_unfinished():
            time.sleep(max(0.0, longs[sent][0] - now))      # idle until the next long prompt
            continue
        for rid, out in engine.step():
            outputs[rid] = out
            if kinds[rid] == "short" and time.perf_counter() - start < mix.window_s:
                kinds[engine.add_request(short_ids(), greedy(mix.short_output))] = "short"
    synchronize(device)
    m = metrics(outputs, kinds, scheduled, time.perf_counter() - start)
    if preempted is not None:       # a stalled repeat: did the pool run out and recompute?
        m["num_preemptions"] = measure.preemptions(engine) - preempted
    return m


def metrics(outputs: dict, kinds: dict, scheduled: dict, wall: float) -> dict:
    """ITL over every gap, TTFT per kind (a long prompt's from its scheduled arrival), tok/s."""
    itls = [x for out in outputs.values() for x in out.itl]
    ttft = {kind: [out.token_times[0] - scheduled.get(rid, out.arrival_time)
                   for rid, out in outputs.items() if kinds[rid] == kind] for kind in ("short", "long")}
    tokens = sum(len(out.token_ids) for out in outputs.values())
    m = {"output_tok_s": tokens / wall, "wall_s": wall, "itl_p50_ms": 1e3 * percentile(itls, 50),
         "itl_p99_ms": 1e3 * percentile(itls, 99), "itl_max_ms": 1e3 * max(itls),
         "num_long": len(ttft["long"]), "num_short": len(ttft["short"])}
    for kind, values in ttft.items():
        if values:
            m[f"ttft_{kind}_p50_ms"], m[f"ttft_{kind}_p99_ms"] = 1e3 * percentile(values, 50), 1e3 * percentile(values, 99)
    return m


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile, linear between the two nearest ranks (numpy's default)."""
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (k - lo)


WARM_UP_WINDOW_S = 2.0


def warm_up(engine, mix: Mix, device: str) -> None:
    """The longest prompt and a few streams' worth, a few tokens each, then the mix itself for a
    short window, discarded: kernels compiled (a JIT backend compiles per shape class) and the
    allocator grown for the steps the clock sees: every stream decoding beside a prefill chunk.
    (A stall in a timed repeat queues the long prompts behind it, and the queue drains slowly.)"""
    prompts = [[1] * mix.long_hi] + [[2] * mix.short_prompt] * min(mix.streams, 8)
    engine.generate(prompts, [greedy(4)] * len(prompts))
    sample(engine, dataclasses.replace(mix, window_s=min(mix.window_s, WARM_UP_WINDOW_S)), device)


# --- the run ------------------------------------------------------------------------------------
def compare(preset: str, args, run: dict, out: Path) -> list[dict]:
    """Every engine on the mix, interleaved and rotated; records rewritten after every round."""
    mix, engines = mix_for(preset, args.scale), {}
    try:
        for spec in args.engines:
            engines[spec] = build(spec, preset, mix, args)
            warm_up(engines[spec], mix, args.device)
        samples = {spec: [] for spec in engines}
        for rep in tqdm(range(args.repeats or REPEATS[args.scale]), desc=f"{preset} rounds", leave=False):
            for spec in bench.rotated(list(engines), rep):
                with bench.quiet_gc(True):
                    samples[spec].append({"repeat": rep, **sample(engines[spec], mix, args.device)})
            records = bench.with_aa([record(spec, preset, mix, samples[spec], args, run) for spec in engines])
            write_records(out, records)
        return records
    finally:
        bench.close(engines)


def build(spec: str, preset: str, mix: Mix, args):
    """A phase engine with its spec's options and a KV pool the mix can fill."""
    options = bench.parse_engine_options(",".join(spec.split()[1:]))
    per_token = resolve(preset).config.kv_bytes_per_token(parse_dtype(args.dtype))
    options.setdefault("kv_cache_bytes", mix.kv_tokens() * per_token)
    return make_engine(bench.engine_name(spec), preset, args.device, args.dtype, **options)


def record(spec: str, preset: str, mix: Mix, samples: list[dict], args, run: dict) -> dict:
    """setting: the engine's own options (a report labels the engine with them); the mix, the
    same for every engine of the preset, is the record's "mix"."""
    metrics, spread = stats.summarize(samples)
    setting = bench.parse_engine_options(",".join(spec.split()[1:]))
    return {"phase": args.phase, "engine": bench.instance_name(spec), "workload": WORKLOAD, "preset": preset,
            "dtype": args.dtype, "scale": args.scale, "setting": setting, "mix": dataclasses.asdict(mix),
            "device": device_name(args.device),
            "run_id": run["run_id"], "part": run["part"], "repeats": len(samples), "metrics": metrics,
            "spread": spread, "samples": samples,
            "provenance": provenance(device_name(args.device)) | {"make_command": run["make_command"]}}


def line(rec: dict) -> str:
    m, options = rec["metrics"], " ".join(f"{k}={v}" for k, v in rec["setting"].items())
    ttft = "  ".join(f"TTFT {k} p50/p99 {m.get(f'ttft_{k}_p50_ms', 0):.0f}/{m.get(f'ttft_{k}_p99_ms', 0):.0f} ms"
                     for k in ("long", "short"))
    return (f"[bench] {rec['engine']:<6} {options:<28} {rec['preset']} {rec['device']}: "
            f"{m['output_tok_s']:8.1f} out tok/s  ITL p50/p99 {m['itl_p50_ms']:.1f}/{m['itl_p99_ms']:.1f} ms  {ttft}")


# --- the README's generated lines: `python -m common.long_mix readme <phase>` ---------------------
GPU = "NVIDIA H200"


def newest_runs(records: list[dict], device: str, preset: str) -> list[list[dict]]:
    """The newest long-mix run of each part on this device and preset (parts in name order), each
    run's records p10 first, then by budget. Ratios are read inside one run only."""
    recs = [r for r in records if r["workload"] == WORKLOAD and r["device"] == device and r["preset"] == preset]
    newest: dict[str, dict] = {}
    for r in recs:
        part = str(r.get("part"))
        if part not in newest or r["provenance"]["utc"] > newest[part]["provenance"]["utc"]:
            newest[part] = r
    return [sorted((r for r in recs if r["run_id"] == newest[part]["run_id"]),
                   key=lambda r: (bool(r["setting"]), r["setting"].get("max_num_batched_tokens", 0), engine_label(r)))
            for part in sorted(newest)]


def budget_label(rec: dict) -> str:
    """"p10", "p10#2 (A/A)", or this phase's engine by its budget: "2048", "2048, K=2"."""
    if not rec["setting"]:
        return rec["engine"] + (" (A/A)" if stats.TWIN in rec["engine"] else "")
    k = rec["setting"].get("max_num_partial_prefills")
    return f"{rec['setting']['max_num_batched_tokens']}" + (f", K={k}" if k else "")


def default_budget(phase: str) -> int:
    config = importlib.import_module(f"phases.{phase}.config").EngineConfig
    return config.__dataclass_fields__["max_num_batched_tokens"].default


def versus(rec: dict, base: dict, twin: dict, key: str) -> str:
    """rec over base per repeat pair as a speed ratio, judged against twin over base."""
    return stats.format_ratio(stats.paired_ratio(rec, base, key), stats.paired_ratio(twin, base, key), show_aa=False)


def headline(records: list[dict], phase: str, device: str = GPU, preset: str = "llama-1b") -> str:
    default = {"max_num_batched_tokens": default_budget(phase)}
    runs = [recs for recs in newest_runs(records, device, preset) if any(r["setting"] == default for r in recs)]
    if not runs:
        return f"_No long-mix run on {device} with {preset} yet: `make phase-{phase[1:3]} bench PART=long-mix` awaits an H200._"
    recs = runs[0]
    rec, base, twin = next(r for r in recs if r["setting"] == default), recs[0], recs[1]
    m, b = rec["metrics"], base["metrics"]
    return (f"**{m['itl_p99_ms'] / m['itl_p50_ms']:.2f}× ITL p99 over p50** at the default budget "
            f"({default_budget(phase)} tokens; p10: {b['itl_p99_ms'] / b['itl_p50_ms']:.2f}×), beside an ITL p50 of "
            f"{m['itl_p50_ms']:.1f} ms against p10's {b['itl_p50_ms']:.1f} ({versus(rec, base, twin, 'itl_p50_ms')}), "
            f"long-mix on {preset}, {device}: ITL p99 {versus(rec, base, twin, 'itl_p99_ms')} shorter than p10's, output tok/s "
            f"{versus(rec, base, twin, 'output_tok_s')}, TTFT p50 of the long prompts "
            f"{versus(rec, base, twin, 'ttft_long_p50_ms')} and of the short ones "
            f"{versus(rec, base, twin, 'ttft_short_p50_ms')} (speed ratios over p10 per repeat pair, "
            f"judged against p10#2 over p10 on the same metric; git {short_sha(rec['provenance']['git_sha'])}).\n\n"
            f"**A/A:** p10 built twice in the same run, p10#2 over p10: ITL p99 "
            f"{aa_text(twin, base, 'itl_p99_ms')}, ITL p50 {aa_text(twin, base, 'itl_p50_ms')}, output tok/s {aa_text(twin, base, 'output_tok_s')}, TTFT p50 of "
            f"the long prompts {aa_text(twin, base, 'ttft_long_p50_ms')}, of the short ones "
            f"{aa_text(twin, base, 'ttft_short_p50_ms')}.")


def aa_text(twin: dict, base: dict, key: str) -> str:
    r = stats.paired_ratio(twin, base, key)
    return "–" if r is None else f"{stats.fmt_bound(r['median'])}× ({stats.format_range(r)})"


def results_table(records: list[dict], device: str = GPU) -> str:
    """Every engine of the newest long-mix run of each part and preset: medians, and ratios over
    that run's p10 (judged against its own p10#2)."""
    rows, used = [], []
    for preset in sorted({r["preset"] for r in records if r["device"] == device and r["workload"] == WORKLOAD}):
        runs = newest_runs(records, device, preset)
        for recs in runs:
            base, twin = recs[0], recs[1]
            used.append(base)
            label = preset if len(runs) == 1 else f"{preset} ({base['part']})"
            rows += [run_row(label, r, base, twin) for r in recs]
    header = ["model", "engine (budget)", "out tok/s", "ITL p50 ms", "ITL p99 ms", "p99/p50", "TTFT long p50 ms",
              "TTFT short p50 ms", "ITL p99 vs p10", "ITL p50 vs p10", "tok/s vs p10", "TTFT long vs p10"]
    sources = "; ".join(f"{r['preset']}: {r['provenance']['make_command']}, git {short_sha(r['provenance']['git_sha'])}, "
                        f"run {r['run_id']}, {r['provenance']['utc'][:10]}" for r in used)
    return (table(header, rows) + f"\n\n_Source: `results/{used[0]['phase']}/{WORKLOAD}*-{device_tag(device)}.json` "
            f"({sources})._") if rows else f"_No long-mix run on {device} yet._"


def run_row(label: str, r: dict, base: dict, twin: dict) -> list[str]:
    m = r["metrics"]
    return ([label, budget_label(r), f"{m['output_tok_s']:,.0f}", f"{m['itl_p50_ms']:.1f}", f"{m['itl_p99_ms']:.1f}",
             f"{m['itl_p99_ms'] / m['itl_p50_ms']:.2f}", f"{m['ttft_long_p50_ms']:.0f}", f"{m['ttft_short_p50_ms']:.0f}"]
            + (["–"] * 4 if r is base else [versus(r, base, twin, k) for k in COMPARED]))


COMPARED = ("itl_p99_ms", "itl_p50_ms", "output_tok_s", "ttft_long_p50_ms")     # the table's ratio columns


def update_readme(phase: str) -> None:
    """Rewrite the README's long-mix blocks (headline, table) from results/<phase>/."""
    records = read_records(phase)
    fill_readme_blocks(phase, "long-mix", {"headline": headline(records, phase), "table": results_table(records)})


def main(argv=None, part: str | None = None, make_command: str | None = None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["readme"]:
        update_readme(argv[1])
        return []
    args = parse_args(argv)
    out = Path(args.out or RESULTS / args.phase / f"{args.file}-{device_tag(device_name(args.device))}.json")
    bench.check_out(out)
    run = {"run_id": uuid.uuid4().hex[:12], "part": part, "make_command": make_command}
    records = []
    with bench.pinned_cores(True, args.device):
        for preset in args.presets:
            new = compare(preset, args, run, out)
            print("\n".join(line(r) for r in new), flush=True)
            records += new
    print(f"[bench] run {run['run_id']}: wrote {len(records)} records to {out}")
    return records


def parse_args(argv):
    p = runner_args.parser(__doc__, "p11_chunked_prefill", "p10,p10#2,p11 max_num_batched_tokens=2048", WORKLOAD)
    p.add_argument("--file", default=WORKLOAD, help="result file stem under results/<phase>/ (default: the "
                   "workload); a part whose engines another part also runs on the same preset needs its own file, "
                   "or its run replaces theirs")
    return runner_args.finish(p, argv)


if __name__ == "__main__":
    main()
