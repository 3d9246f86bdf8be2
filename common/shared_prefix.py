"""The shared-prefix workloads: requests that begin alike, and their runner:
what a prefix cache buys, and what it costs where nothing is shared.

  python -m common.shared_prefix --phase p12_prefix_caching --presets llama-1b \
      --workloads shared-prefix,no-sharing --engines "p11,p11#2,p12"
  python -m common.shared_prefix readme p12_prefix_caching   # the README's generated headline and table

A workload is `sessions` conversations of `turns` turns (Chats). A session's first prompt is a
`first`-token beginning, the same for every session (`shared`) or its own, then a unique part of
suffix_lo..suffix_hi tokens, a whole number of blocks in every other session; each later turn's
prompt is the turn before it (prompt and answer) plus a new message of that many tokens, sent the
moment that turn finishes (a closed loop per session, every session at once from the start).
Token ids and lengths are seeded: every engine and repeat gets the same requests.

  shared-prefix  128 requests sharing a 4k-token system prompt, one turn each
  no-sharing     the same lengths, every beginning its own: the control (nothing to share)
  multi-turn     32 sessions x 4 turns, each turn re-sending the whole conversation
  chat           1 session x 4 turns opening with a long paste (a chat at the command line)

One sample per engine and repeat: TTFT p50/p99 over every request (from its submission), of the
last turn alone, output and total tok/s over the sample's wall time, and the hit rate: prompt
tokens read from the cache over all prompt tokens (Sequence.num_cached_tokens; 0 for an engine
without a cache), beside the ideal for the same requests (ideal_hit_rate). The cache is cleared
before every sample (engine.reset_prefix_cache(), "cache": "cleared" in every record) unless
--cache warm asks for the warm case ("kept": each repeat finds what the one before it left).
Engines of one preset are built side by side and measured interleaved and rotated, as
common.bench does; an engine listed twice ("p11,p11#2") is the run's A/A control.
"""
from __future__ import annotations

import dataclasses
import random
import sys
import time
import uuid
from pathlib import Path

from tqdm import tqdm

from . import bench, runner_args, stats
from .device import device_name, parse_dtype, synchronize
from .engines import make_engine
from .loader import resolve
from .long_mix import percentile
from .report import short_sha, table
from .results import RESULTS, device_tag, fill_readme_blocks, provenance, read_records, write_records
from .workloads import PROMPT_ID_RANGE, greedy

BLOCK = 16           # the block size the ideal hit rate is counted in (the engines' default)


@dataclasses.dataclass(frozen=True)
class Chats:
    name: str
    sessions: int
    turns: int
    first: int             # tokens every session's first prompt begins with
    shared: bool           # one beginning for all sessions, or each its own
    suffix_lo: int         # a session's unique part of its first prompt, and each later message,
    suffix_hi: int         # uniform in [suffix_lo, suffix_hi] tokens
    output: int            # new tokens per turn (greedy, ignore_eos)
    kv_requests: int       # the KV pool holds this many of the longest requests at once
    seed: int = 0

    def longest(self) -> int:
        """Tokens of the longest request: the last turn of a session."""
        return self.first + self.turns * (self.suffix_hi + 1 + self.output)

    def beginnings(self) -> list[list[int]]:
        """Every session's first prompt: its beginning, then its unique part (lengths drawn apart
        from ids: shared or not, the same lengths)."""
        rng, sizes = random.Random(self.seed), random.Random(self.seed + 2)
        common = ids(rng, self.first)
        return [(common if self.shared else ids(rng, self.first)) + ids(rng, self.suffix(sizes, s))
                for s in range(self.sessions)]

    def messages(self) -> list[list[list[int]]]:
        """messages()[s][t]: what session s adds after turn t's answer."""
        rng = random.Random(self.seed + 1)
        return [[ids(rng, self.suffix(rng, s)) for _ in range(self.turns - 1)] for s in range(self.sessions)]

    def suffix(self, rng: random.Random, session: int) -> int:
        """A length in [lo, hi]: a whole number of blocks for even sessions, never for odd ones."""
        n = rng.randint(self.suffix_lo, self.suffix_hi)
        return max(BLOCK, n - n % BLOCK) if session % 2 == 0 else n + (n % BLOCK == 0)


def ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(PROMPT_ID_RANGE) for _ in range(n)]


# The sizes on the GPU, and at small scale on a CPU (tiny-llama; chat: SmolLM2, a ~5,000-character paste).
WORKLOADS = {
    ("shared-prefix", "full"): Chats("shared-prefix", 128, 1, 4096, True, 32, 256, 128, kv_requests=32),
    ("no-sharing", "full"): Chats("no-sharing", 128, 1, 4096, False, 32, 256, 128, kv_requests=32),
    ("multi-turn", "full"): Chats("multi-turn", 32, 4, 1024, False, 64, 256, 128, kv_requests=32),
    ("shared-prefix", "small"): Chats("shared-prefix", 16, 1, 256, True, 8, 40, 8, kv_requests=8),
    ("no-sharing", "small"): Chats("no-sharing", 16, 1, 256, False, 8, 40, 8, kv_requests=8),
    ("multi-turn", "small"): Chats("multi-turn", 4, 4, 128, False, 16, 32, 8, kv_requests=4),
    ("chat", "small"): Chats("chat", 1, 4, 1200, False, 16, 32, 32, kv_requests=1),
}
REPEATS = {"full": 3, "small": 3}


# --- one sample ---------------------------------------------------------------------------------
def sample(engine, chats: Chats, device: str, clear: bool) -> dict:
    """Run every session to its last turn on an idle engine (its step API); the sample's metrics."""
    if clear and hasattr(engine, "reset_prefix_cache"):
        engine.reset_prefix_cache()
    messages, live, done = chats.messages(), {}, []

    def submit(session: int, turn: int, prompt: list[int]) -> None:
        rid = engine.add_request(prompt, greedy(chats.output))
        live[rid] = (session, turn, engine.requests.get(rid))   # its Sequence: how much it found cached
    synchronize(device)
    start = time.perf_counter()
    for s, prompt in enumerate(chats.beginnings()):
        submit(s, 0, prompt)
    while engine.has_unfinished():
        for rid, out in engine.step():
            s, t, seq = live.pop(rid)
            done.append((t, out, getattr(seq, "num_cached_tokens", 0) or 0))
            if t + 1 < chats.turns:
                submit(s, t + 1, out.prompt_token_ids + out.token_ids + messages[s][t])
    synchronize(device)
    return metrics(done, time.perf_counter() - start, chats)


def metrics(done: list[tuple], wall: float, chats: Chats) -> dict:
    """done: (turn, Output, cached prompt tokens) per request, in the order they finished."""
    ttft = [out.ttft for _, out, _ in done]
    last = [out.ttft for t, out, _ in done if t == chats.turns - 1]
    prompt = sum(len(out.prompt_token_ids) for _, out, _ in done)
    output = sum(len(out.token_ids) for _, out, _ in done)
    return {"ttft_p50_ms": 1e3 * percentile(ttft, 50), "ttft_p99_ms": 1e3 * percentile(ttft, 99),
            "ttft_last_turn_p50_ms": 1e3 * percentile(last, 50), "output_tok_s": output / wall,
            "total_tok_s": (prompt + output) / wall, "wall_s": wall, "num_requests": len(done),
            "prompt_tokens": prompt, "hit_rate": sum(c for _, _, c in done) / prompt,
            "ideal_hit_rate": ideal_hit_rate([out for _, out, _ in sorted(done, key=lambda d: d[1].arrival_time)])}


def ideal_hit_rate(outputs: list, block_size: int = BLOCK) -> float:
    """The hit rate of an unbounded cache: each request (in submission order) reads the longest
    prefix, in full blocks and never its last token, of the tokens of the requests before it
    (their prompts and answers, the last token excepted: its K/V is never computed)."""
    trie, hits = {}, 0
    for out in outputs:
        prompt = out.prompt_token_ids
        node = trie
        for i in range((len(prompt) - 1) // block_size):
            node = node.get(tuple(prompt[i * block_size:(i + 1) * block_size]))
            if node is None:
                break
            hits += block_size
        tokens, node = prompt + out.token_ids[:-1], trie
        for i in range(len(tokens) // block_size):
            node = node.setdefault(tuple(tokens[i * block_size:(i + 1) * block_size]), {})
    return hits / sum(len(out.prompt_token_ids) for out in outputs)


def warm_up(engine, chats: Chats) -> None:
    """The longest prompt and a few short ones, a few tokens each; then a cold cache again."""
    prompts = [[1] * (chats.longest() - chats.output)] + [[2] * chats.suffix_hi] * 4
    engine.generate(prompts, [greedy(4)] * len(prompts))
    if hasattr(engine, "reset_prefix_cache"):
        engine.reset_prefix_cache()


# --- the run ------------------------------------------------------------------------------------
def compare(preset: str, args, run: dict, out: Path) -> list[dict]:
    """Every engine on every workload, interleaved and rotated; records rewritten after every
    round. Each workload is a comparison of its own (its own run id)."""
    works = [workload_for(w, args.scale) for w in args.workloads]
    engines, records = {}, []
    try:
        for spec in args.engines:
            engines[spec] = build(spec, preset, works, args)
            warm_up(engines[spec], max(works, key=Chats.longest))
        for chats in works:
            records += measure(engines, chats, preset, args, run | {"run_id": uuid.uuid4().hex[:12]}, out)
        return records
    finally:
        bench.close(engines)


def measure(engines: dict, chats: Chats, preset: str, args, run: dict, out: Path) -> list[dict]:
    samples = {spec: [] for spec in engines}
    for rep in tqdm(range(args.repeats or REPEATS[args.scale]), desc=f"{preset} {chats.name}", leave=False):
        for spec in bench.rotated(list(engines), rep):
            with bench.quiet_gc(True):
                samples[spec].append({"repeat": rep, **sample(engines[spec], chats, args.device, args.cache == "cleared")})
        records = bench.with_aa([record(spec, preset, chats, samples[spec], args, run) for spec in engines])
        write_records(out, records)
    print("\n".join(line(r) for r in records), flush=True)
    return records


def workload_for(name: str, scale: str) -> Chats:
    if (name, scale) not in WORKLOADS:
        raise ValueError(f"no {scale}-scale workload {name!r}: one of {sorted(w for w, s in WORKLOADS if s == scale)}")
    return WORKLOADS[name, scale]


def build(spec: str, preset: str, works: list[Chats], args):
    """A phase engine with its spec's options and a KV pool for kv_requests of the longest requests."""
    options = bench.parse_engine_options(",".join(spec.split()[1:]))
    per_token = resolve(preset).config.kv_bytes_per_token(parse_dtype(args.dtype))
    tokens = max(w.kv_requests * (w.longest() + BLOCK) for w in works)
    options.setdefault("kv_cache_bytes", tokens * per_token)
    return make_engine(bench.engine_name(spec), preset, args.device, args.dtype, **options)


def record(spec: str, preset: str, chats: Chats, samples: list[dict], args, run: dict) -> dict:
    metrics, spread = stats.summarize(samples)
    return {"phase": args.phase, "engine": bench.instance_name(spec), "workload": chats.name, "preset": preset,
            "dtype": args.dtype, "scale": args.scale, "setting": bench.parse_engine_options(",".join(spec.split()[1:])),
            "shape": dataclasses.asdict(chats), "cache": args.cache, "device": device_name(args.device),
            "run_id": run["run_id"], "part": run["part"], "repeats": len(samples), "metrics": metrics,
            "spread": spread, "samples": samples,
            "provenance": provenance(device_name(args.device)) | {"make_command": run["make_command"]}}


def line(rec: dict) -> str:
    m = rec["metrics"]
    return (f"[bench] {rec['engine']:<6} {engine_options(rec):<24} {rec['workload']:<13} {rec['preset']} "
            f"{rec['device']}: TTFT p50/p99 {m['ttft_p50_ms']:.0f}/{m['ttft_p99_ms']:.0f} ms  "
            f"{m['output_tok_s']:8.1f} out tok/s  hit rate {m['hit_rate']:.1%} (ideal {m['ideal_hit_rate']:.1%})  "
            f"cache {rec['cache']}")


def engine_options(rec: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in rec["setting"].items())


# --- the README's generated lines: `python -m common.shared_prefix readme <phase>` ----------------
GPU = "NVIDIA H200"
ORDER = ("shared-prefix", "no-sharing", "multi-turn", "chat")


def newest_run(records: list[dict], device: str, preset: str, workload: str) -> list[dict]:
    """The records of the newest run of this workload on this device and preset, baseline first."""
    recs = [r for r in records if (r["workload"], r["device"], r["preset"]) == (workload, device, preset)]
    if not recs:
        return []
    run = max(recs, key=lambda r: r["provenance"]["utc"])["run_id"]
    return sorted((r for r in recs if r["run_id"] == run), key=lambda r: (r["engine"][1:3], r["engine"], engine_options(r)))


def roles(recs: list[dict], phase: str) -> tuple[dict, dict, dict | None]:
    """(this phase's engine with its defaults, the baseline, the baseline's A/A twin)."""
    mine = next(r for r in recs if r["engine"] == phase[:3] and not r["setting"])
    base = next(r for r in recs if r["engine"] != phase[:3] and stats.TWIN not in r["engine"])
    twin = next((r for r in recs if r["engine"] == base["engine"] + stats.TWIN), None)
    return mine, base, twin


def versus(rec: dict, base: dict, twin: dict | None, key: str) -> str:
    """rec over base per repeat pair as a speed ratio, judged against twin over base."""
    aa = stats.paired_ratio(twin, base, key) if twin else None
    return stats.format_ratio(stats.paired_ratio(rec, base, key), aa, show_aa=False)


def aa_text(twin: dict | None, base: dict, key: str) -> str:
    r = stats.paired_ratio(twin, base, key) if twin else None
    return "–" if r is None else f"{stats.fmt_bound(r['median'])}× ({stats.format_range(r)})"


def summary(records: list[dict], phase: str, device: str, preset: str) -> str:
    shared, control = (newest_run(records, device, preset, w) for w in ("shared-prefix", "no-sharing"))
    mine, base, twin = roles(shared, phase)
    m, b = mine["metrics"], base["metrics"]
    text = (f"**{mine['engine']} over {base['engine']} on shared-prefix: TTFT p50 {versus(mine, base, twin, 'ttft_p50_ms')}, "
            f"output tok/s {versus(mine, base, twin, 'output_tok_s')}** ({preset}, {device}; TTFT p50 "
            f"{m['ttft_p50_ms']:,.0f} vs {b['ttft_p50_ms']:,.0f} ms; hit rate {m['hit_rate']:.1%}, ideal "
            f"{m['ideal_hit_rate']:.1%})")
    if control:
        c, cb, ct = roles(control, phase)
        text += (f"; no-sharing control (its own run, judged against that run's A/A): TTFT p50 "
                 f"{versus(c, cb, ct, 'ttft_p50_ms')}, output tok/s {versus(c, cb, ct, 'output_tok_s')}")
    text += (f" (speed ratios per repeat pair, above 1: {mine['engine']} faster; judged against "
             f"{base['engine']}{stats.TWIN} over {base['engine']} on the same metric; git "
             f"{short_sha(mine['provenance']['git_sha'])}).")
    return text + (f"\n\n**A/A:** {base['engine']} built twice in the same run, {base['engine']}{stats.TWIN} over "
                   f"{base['engine']} on shared-prefix: TTFT p50 {aa_text(twin, base, 'ttft_p50_ms')}, output "
                   f"tok/s {aa_text(twin, base, 'output_tok_s')}.")


def headline(records: list[dict], phase: str) -> str:
    """The H200 run on llama-1b; until there is one, the CPU's small run, saying so."""
    if newest_run(records, GPU, "llama-1b", "shared-prefix"):
        return summary(records, phase, GPU, "llama-1b")
    pending = (f"_The {GPU} run is pending: `make phase-{phase[1:3]} bench PART=shared-prefix` awaits a GPU. "
               f"Until then, the small CPU run (tiny-llama, this repository's CPU, not a performance claim):_ ")
    if newest_run(records, "cpu", "tiny-llama", "shared-prefix"):
        return pending + summary(records, phase, "cpu", "tiny-llama")
    return pending + "_none yet either._\n\n**A/A:** pending with the run."


def chat_line(records: list[dict], phase: str) -> str:
    """The chat's last turn: its first token with the cache (this engine) and without (the baseline)."""
    recs = newest_run(records, "cpu", "smollm2-135m", "chat")
    if not recs:
        return f"_No chat run yet: `make phase-{phase[1:3]} bench PART=chat` on a CPU._"
    on, off, twin = roles(recs, phase)
    key, turns, first = "ttft_last_turn_p50_ms", on["shape"]["turns"], on["shape"]["first"]
    return (f"**The chat** (SmolLM2-135M on this repository's CPU, {turns} turns opening with a {first:,}-token "
            f"paste): the last turn's first token after {on['metrics'][key]:,.0f} ms with the cache, "
            f"{off['metrics'][key]:,.0f} ms without it ({off['engine']}), {versus(on, off, twin, key)} sooner "
            f"(per repeat pair, median of {on['repeats']}, judged against {off['engine']}'s A/A).")


def results_table(records: list[dict], phase: str) -> str:
    """Every engine of the newest run per device, preset and workload: medians, ratios over the baseline."""
    rows, used = [], []
    keys = {(r["device"], r["preset"], r["workload"]) for r in records if r["workload"] in ORDER}
    for device, preset, workload in sorted(keys, key=lambda k: (k[0] != GPU, k[1], ORDER.index(k[2]))):
        recs = newest_run(records, device, preset, workload)
        mine, base, twin = roles(recs, phase)
        used.append(mine)
        for r in recs:
            m = r["metrics"]
            rows.append([device.replace("NVIDIA ", ""), preset, workload, label(r), f"{m['ttft_p50_ms']:,.0f}",
                         f"{m['ttft_p99_ms']:,.0f}", f"{m['ttft_last_turn_p50_ms']:,.0f}", f"{m['output_tok_s']:,.0f}",
                         f"{m['hit_rate']:.1%} ({m['ideal_hit_rate']:.1%})"]
                        + (["–"] * 2 if r is base else [versus(r, base, twin, k) for k in ("ttft_p50_ms", "output_tok_s")]))
    header = ["device", "model", "workload", "engine", "TTFT p50 ms", "TTFT p99 ms", "last turn TTFT p50 ms",
              "out tok/s", "hit rate (ideal)", "TTFT p50 vs baseline", "tok/s vs baseline"]
    sources = "; ".join(sorted({f"`{r['file']}` ({r['provenance']['make_command']}, git "
                                f"{short_sha(r['provenance']['git_sha'])}, {r['provenance']['utc'][:10]}, cache "
                                f"{r['cache']} before every sample)" for r in used}))
    return f"{table(header, rows)}\n\n_Source: {sources}._" if rows else "_No shared-prefix run yet._"


def label(rec: dict) -> str:
    """"p11", "p11#2 (A/A)", "p12", "p12 enable_prefix_caching=0"."""
    return " ".join(filter(None, [rec["engine"], engine_options(rec)])) + (" (A/A)" if stats.TWIN in rec["engine"] else "")


def update_readme(phase: str) -> None:
    """Rewrite the README's shared-prefix blocks (headline, chat line, table) from results/<phase>/."""
    records = read_records(phase)
    fill_readme_blocks(phase, "shared-prefix", {"headline": headline(records, phase), "chat": chat_line(records, phase),
                                                "table": results_table(records, phase)})


def main(argv=None, part: str | None = None, make_command: str | None = None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["readme"]:
        update_readme(argv[1])
        return []
    args = parse_args(argv)
    stem = "-".join(args.workloads) + ("-warm" if args.cache == "warm" else "")
    out = Path(args.out or RESULTS / args.phase / f"{stem}-{device_tag(device_name(args.device))}.json")
    bench.check_out(out)
    run, records = {"part": part, "make_command": make_command}, []
    with bench.pinned_cores(True, args.device):
        for preset in args.presets:
            records += compare(preset, args, run, out)
    print(f"[bench] wrote {len(records)} records to {out}")
    return records


def parse_args(argv):
    p = runner_args.parser(__doc__, "p12_prefix_caching", "p11,p11#2,p12,p12 enable_prefix_caching=0",
                           "<workloads>")
    p.add_argument("--workloads", default="shared-prefix,no-sharing", help=f"comma-separated: {', '.join(ORDER)}")
    p.add_argument("--cache", choices=["cleared", "warm"], default="cleared",
                   help="clear the prefix cache before every sample (default), or keep it (a warm cache)")
    args = runner_args.finish(p, argv)
    args.workloads = args.workloads.split(",")
    try:
        [workload_for(w, args.scale) for w in args.workloads]
    except ValueError as e:
        p.error(str(e))
    return args


if __name__ == "__main__":
    main()
