"""Speculative decoding's measurements: how often the real model accepts prompt-lookup drafts,
and what a verify step buys at a controlled acceptance.

  python -m common.spec_decode acceptance --phase p13_speculative_decoding \
      --engines "p12,p12#2,p13 speculative=ngram num_speculative_tokens=4"
  python -m common.spec_decode speed --phase p13_speculative_decoding --presets llama-8b --batches 1 \
      --acceptances 0.3,0.6,0.8,0.95 --ks 2,4,8
  python -m common.spec_decode readme p13_speculative_decoding     # the README's generated tables

acceptance: SmolLM2 (real weights), greedy, on two prompt sets: GROUNDED prompts whose answer
copies from the prompt (summarise or quote a passage, edit code, answer from a document) and
OPEN ones that do not (stories, explanations). Acceptance is a property of the model and the
prompts, not of the machine: the same on any device. Per sample: acceptance rate (accepted over
drafted tokens), mean accepted length (tokens a verify gives: 1 + accepted per draft), tokens per
target step (per decoding sequence, drafted or not), output tok/s and the per-request TPOT (first
to last token over the gaps between them); the inter-token gap p50 is kept too, and reads 0 ms
once tokens arrive in bursts, which is why TPOT is the latency figure here.

speed: random-weight presets, where prompt lookup finds nothing to draft. A ScriptedProposer
replays the target's own greedy continuation, each token kept with chance `acceptance` and
replaced otherwise, by a hash of its position: every engine and repeat sees the same drafts. The
continuation is recorded for each (k, acceptance, switch) under that setting's own steps (see
script()). Batch 1 is the standard latency workload, larger batches the standard concurrency
one. One p13 engine is built beside the previous phase and its A/A twin, and set to each setting
between samples; all are measured interleaved and rotated, as common.bench does. The measured
acceptance is recorded beside the asked one, and so is `script_replayed` in every sample (the
share of requests whose recorded path the last recording pass gave back): where bf16 rounding
makes the target leave its recorded path, every later draft of that request is wrong and the
measured rate falls below the asked one.
"""
from __future__ import annotations

import random
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from . import bench, measure, runner_args, stats, workloads
from .device import device_name, parse_dtype, synchronize
from .engines import make_engine
from .loader import resolve
from .report import part_of, table
from .results import RESULTS, device_tag, fill_readme_blocks, provenance, read_records, write_records

PASSAGE = ("The Great Barrier Reef, off the coast of Queensland, Australia, is the world's largest coral reef "
           "system. It is made of over 2,900 individual reefs and 900 islands stretching over 2,300 kilometres. "
           "The reef was declared a World Heritage Site in 1981. Rising sea temperatures have caused mass coral "
           "bleaching events in 1998, 2002, 2016, 2017 and 2020, and the reef is protected by the Great Barrier "
           "Reef Marine Park Authority.")
CODE = ("def mean(values):\n    total = 0\n    for v in values:\n        total = total + v\n"
        "    return total / len(values)\n\n\ndef variance(values):\n    m = mean(values)\n    total = 0\n"
        "    for v in values:\n        total = total + (v - m) ** 2\n    return total / len(values)\n")
GROUNDED = [f"Summarise this text in two sentences.\n\n{PASSAGE}",
            f"Read the text, then answer: when was the reef declared a World Heritage Site, and which years "
            f"had mass bleaching?\n\n{PASSAGE}",
            f"Repeat the following text, but replace every number written in digits with the word NUMBER.\n\n{PASSAGE}",
            f"Rename the variable `total` to `acc` in this Python code and show the whole code.\n\n{CODE}",
            f"Add a docstring to each function of this Python code and show the whole code.\n\n{CODE}",
            f"Rewrite this code so that `variance` takes a precomputed mean as a second argument.\n\n{CODE}"]
OPEN = ["Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Explain how a refrigerator keeps food cold.",
        "What are three good habits for learning a new language?",
        "Describe a busy market in a city you imagine.",
        "Give advice to someone starting their first job.",
        "Why do people enjoy music?"]
PROMPT_SETS = {"grounded": GROUNDED, "open": OPEN}
MAX_TOKENS = {"full": 128, "small": 64}
SPEED_SCALE = {"full": (32, 256), "small": (16, 24)}       # batch 1: prompt and output tokens
TWIN = stats.TWIN


# --- the scripted proposer ------------------------------------------------------------------------
@dataclass
class Draft:
    token_ids: list[int]
    probs: None = None             # deterministic drafts: the rejection sampler takes q one-hot


class ScriptedProposer:
    """Drafts script[prompt]: the target's greedy continuation, each token kept with chance
    `acceptance`, else replaced by another (the choice a hash of the request and position).
    `scripts` holds one (script, share of requests it replayed) per speed setting (script());
    use() makes a setting's the current one."""

    def __init__(self, vocab_size: int, acceptance: float = 1.0, seed: int = 0):
        self.vocab_size, self.acceptance, self.seed = vocab_size, acceptance, seed
        self.script: dict[tuple[int, ...], list[int]] = {}
        self.replayed: float | None = None
        self.scripts: dict[tuple, tuple[dict[tuple[int, ...], list[int]], float]] = {}

    def use(self, key: tuple, acceptance: float) -> None:
        self.acceptance = acceptance
        self.script, self.replayed = self.scripts.get(key, ({}, None))

    def propose(self, seqs, k: int) -> list[Draft]:
        return [Draft(self.draft(tuple(seq.prompt_ids), len(seq.output_ids), k)) for seq in seqs]

    def draft(self, prompt: tuple[int, ...], start: int, k: int) -> list[int]:
        out = []
        for i, token in enumerate(self.script.get(prompt, [])[start:start + k], start):
            rng = random.Random(hash((self.seed, prompt[:8], len(prompt), i)))
            keep = rng.random() < self.acceptance
            out.append(token if keep else (token + 1 + rng.randrange(self.vocab_size - 1)) % self.vocab_size)
        return out

    def release(self, seq) -> None:
        pass


# --- one sample -------------------------------------------------------------------------------------
def counters(engine) -> dict:
    spec = getattr(engine, "speculator", None)
    return spec.counters() if spec is not None else {}


def sample(engine, prompts: list[list[int]], params, device: str, latency: bool) -> dict:
    """One generate() of every prompt at once: speed, TPOT, and the speculation counters' change."""
    before = counters(engine)
    synchronize(device)
    outs = engine.generate(prompts, params)
    synchronize(device)
    t0, t1 = min(o.arrival_time for o in outs), max(o.token_times[-1] for o in outs)
    n = sum(len(o.token_ids) for o in outs)
    tpots = sorted((o.token_times[-1] - o.token_times[0]) / (len(o.token_times) - 1) for o in outs if len(o.token_times) > 1)
    itls = sorted(x for o in outs for x in o.itl)
    out = {"output_tok_s": n / (t1 - t0), "tpot_p50_ms": 1e3 * tpots[len(tpots) // 2], "itl_ms_p50": 1e3 * itls[len(itls) // 2]}
    if latency:
        out |= {"decode_tok_s": 1e3 / out["tpot_p50_ms"], "ms_per_token": out["tpot_p50_ms"],
                "prefill_ms": 1e3 * (outs[0].token_times[0] - outs[0].arrival_time)}
    proposer = getattr(getattr(engine, "speculator", None), "proposer", None)
    replayed = getattr(proposer, "replayed", None)             # a ScriptedProposer's, at this setting
    return out | spec_metrics(before, counters(engine)) | ({} if replayed is None else {"script_replayed": replayed})


def spec_metrics(before: dict, after: dict) -> dict:
    if not after:
        return {}
    d = {k: after[k] - before[k] for k in after if isinstance(after[k], int)}
    drafted, drafts = d["spec_decode_num_draft_tokens"], d["spec_decode_num_drafts"]
    return {"acceptance_rate": d["spec_decode_num_accepted_tokens"] / drafted if drafted else 0.0,
            "mean_accepted_len": 1 + d["spec_decode_num_accepted_tokens"] / drafts if drafts else 1.0,
            "tokens_per_step": d["decode_tokens"] / max(1, d["decode_rows"]),
            "drafted_share": drafts / max(1, d["decode_rows"])}


# --- the runs ---------------------------------------------------------------------------------------
def build(spec: str, preset: str, args, prompts, params):
    options = bench.parse_engine_options(",".join(spec.split()[1:]))
    if args.device.startswith("cuda"):      # several engines share the GPU: a pool for this workload
        work = workloads.Workload("concurrency", list(zip(prompts, params)))
        options.setdefault("kv_cache_bytes", measure.kv_budget_bytes(preset, parse_dtype(args.dtype), [work]))
    options.setdefault("max_num_batched_tokens", one_step_budget(prompts, args))
    return make_engine(bench.engine_name(spec), preset, args.device, args.dtype, **options)


def one_step_budget(prompts, args) -> int:
    """A token budget that prefills every prompt in one step, drafts included (every engine of
    the run gets it, so p12 and p13 prefill alike). With the default budget (2048) a batch of 16
    prompts of 512 tokens is prefilled in chunks, and drafts move the chunk boundaries (decodes
    with drafts take more of each step). In bf16 other boundaries give other K/V values, and the
    target leaves a script recorded with other boundaries: on a CPU in bf16 a chunked batch of 16
    measured acceptance 0.68 where one prefill step measured 0.86 (asked: 0.95)."""
    return max(2048, sum(len(p) for p in prompts) + len(prompts) * (1 + max(args.ks)))


def measure_all(preset: str, args, configs: list[tuple[str, object, dict]], prompts, params, latency: bool,
                run: dict, workload: str, out: Path, extra: dict) -> list[dict]:
    """configs: (label, engine, setting applier's setting). Warm, then rounds, rotated."""
    for _, engine, setting in configs:
        apply(engine, setting)
        engine.generate(prompts, [workloads.greedy(8)] * len(prompts))
    samples = {label: [] for label, _, _ in configs}
    for rep in tqdm(range(args.repeats), desc=f"{preset} rounds", leave=False):
        for label, engine, setting in bench.rotated(configs, rep):
            apply(engine, setting)
            with bench.quiet_gc():
                samples[label].append({"repeat": rep, **sample(engine, prompts, params, args.device, latency)})
        records = [record(label, setting, samples[label], preset, args, run, workload, extra)
                   for label, _, setting in configs]
        write_records(out, bench.with_aa(records))
    return records


def apply(engine, setting: dict) -> None:
    """Set a p13 engine to one (acceptance, k, switch) of the speed sweep (nothing for others)."""
    if "scripted_acceptance" in setting:
        spec = engine.speculator
        spec.proposer.use(script_key(setting), setting["scripted_acceptance"])
        spec.k, spec.accepted_per_pos = setting["num_speculative_tokens"], [0] * setting["num_speculative_tokens"]
        spec.max_batch = setting.get("speculative_disable_by_batch_size", engine.config.speculative_disable_by_batch_size)


def record(label: str, setting: dict, samples: list[dict], preset: str, args, run: dict, workload: str,
           extra: dict) -> dict:
    metrics, spread = stats.summarize(samples)
    return {"phase": args.phase, "engine": label.split()[0], "workload": workload, "preset": preset, "dtype": args.dtype,
            "scale": args.scale, "setting": extra | setting, "device": device_name(args.device), "run_id": run["run_id"],
            "part": run["part"], "repeats": len(samples), "metrics": metrics, "spread": spread, "samples": samples,
            "provenance": provenance(device_name(args.device)) | {"make_command": run["make_command"]}}


def acceptance(args, run: dict) -> list[dict]:
    tok = resolve("smollm2-135m").tokenizer
    out, records = result_file(args), []
    sets = {name: [tok.chat_ids(t) for t in texts] for name, texts in PROMPT_SETS.items()}
    every = [p for prompts in sets.values() for p in prompts]       # a GPU pool sized for all of them
    for preset in args.presets:
        engines = {spec: build(spec, preset, args, every, [workloads.greedy(MAX_TOKENS[args.scale])] * len(every))
                   for spec in args.engines}
        for name, prompts in sets.items():
            params = [workloads.greedy(MAX_TOKENS[args.scale])] * len(prompts)
            configs = [(spec, engine, options(spec)) for spec, engine in engines.items()]
            records += measure_all(preset, args, configs, prompts, params, False, run, "acceptance", out,
                                   {"prompts": name})
    return records


def speed(args, run: dict) -> list[dict]:
    out, records = result_file(args), []
    for preset, batch in [(p, b) for p in args.presets for b in args.batches]:
        work = workloads.latency(*SPEED_SCALE[args.scale]) if batch == 1 else workloads.concurrency(batch, args.scale)
        prompts, params = work.prompts, work.params
        engines = {spec: build(spec, preset, args, prompts, params) for spec in args.engines}
        configs = []
        for spec, engine in engines.items():
            if not hasattr(engine, "speculator") or not engine.config.speculative:
                configs.append((spec, engine, options(spec)))
                continue
            settings = [{"speculative": "scripted", "num_speculative_tokens": k, "scripted_acceptance": a} |
                        ({"speculative_disable_by_batch_size": m} if m else {}) for a, k, m in sweep(args)]
            script(engine, prompts, params, settings)
            for setting in settings:
                configs.append((" ".join([spec.split()[0], *(f"{x}={y}" for x, y in setting.items())]), engine, setting))
        extra = {"batch": 1} if batch == 1 else {"concurrency": batch}
        records += measure_all(preset, args, configs, prompts, params, batch == 1, run,
                               "latency" if batch == 1 else "concurrency", out, extra)
        engines.clear()
        bench.free_memory()
    return records


def result_file(args) -> Path:
    out = Path(args.out or RESULTS / args.phase / f"{args.file or args.measure}-{device_tag(device_name(args.device))}.json")
    bench.check_out(out)
    return out


def sweep(args) -> list[tuple[float, int, int | None]]:
    return [(a, k, m) for m in args.switch for a in args.acceptances for k in args.ks]


def script(engine, prompts, params, settings: list[dict], passes: int = 6) -> None:
    """Gives the engine a ScriptedProposer holding, for each speed setting, the target's greedy
    continuation of every prompt as that setting's own steps compute it, and the share of prompts
    whose path the last pass gave back (1.0: every measured sample replays the recording, so the
    measured acceptance is the asked one's hash pattern; each sample carries it as script_replayed).

    Why per setting: a random-weight model's logits are near-tied, and bf16 rounds a token's
    logits differently in another step layout (decode rows only, verifies of k drafts, requests
    that drifted apart after other acceptances). Replaying the continuation recorded without
    drafts, batch 16 on the H200 measured acceptance 0.02-0.07 whatever was asked; one script per
    k recorded at acceptance 1, 0.49 where 0.88 was asked (k=4, 0.95). So each setting starts
    from the continuation without drafts and replays its last recording until a pass gives it
    back: the steps before a request's first departure are the same in every pass, so each pass
    moves that point later (at most `passes` passes)."""
    proposer = engine.speculator.proposer = ScriptedProposer(engine.model_config.vocab_size)

    def run() -> dict[tuple[int, ...], list[int]]:
        return {tuple(p): out.token_ids for p, out in zip(prompts, engine.generate(prompts, params))}

    first = run()                            # no script yet: no drafts
    for setting in settings:
        apply(engine, setting)
        recorded = first
        for _ in range(passes):
            proposer.script = recorded
            got = run()
            replayed = sum(got[p] == recorded[p] for p in got) / len(got)
            if got == recorded:
                break
            recorded = got
        proposer.scripts[script_key(setting)] = (recorded, replayed)


def script_key(setting: dict) -> tuple:
    return (setting["num_speculative_tokens"], setting["scripted_acceptance"],
            setting.get("speculative_disable_by_batch_size"))


def options(spec: str) -> dict:
    return bench.parse_engine_options(",".join(spec.split()[1:]))


# --- the README's generated tables: `python -m common.spec_decode readme <phase>` ---------------------


def newest(records: list[dict], workload: str, **where) -> list[dict]:
    """The records of the newest run of `workload` (matching `where`), in the order they were listed."""
    recs = [r for r in records if r["workload"] == workload and all(r.get(k) == v for k, v in where.items())]
    if not recs:
        return []
    run = max(recs, key=lambda r: r["provenance"]["utc"])["run_id"]
    return [r for r in recs if r["run_id"] == run]


def versus(rec: dict, recs: list[dict], key: str) -> str:
    """rec over the run's previous-phase record of the same setting, judged against its A/A twin."""
    same = [r for r in recs if bench.workload_setting(r) == bench.workload_setting(rec)
            and r["setting"].get("prompts") == rec["setting"].get("prompts") and "speculative" not in r["setting"]]
    base = next((r for r in same if TWIN not in r["engine"]), None)
    twin = next((r for r in same if TWIN in r["engine"]), None)
    if base is None or rec is base:
        return "–"
    aa = stats.paired_ratio(twin, base, key) if twin else None
    if rec is twin:
        r = stats.paired_ratio(rec, base, key)
        return "–" if r is None else f"{stats.fmt_bound(r['median'])}× ({stats.format_range(r)}) A/A"
    return stats.format_ratio(stats.paired_ratio(rec, base, key), aa, show_aa=False)


def spec_label(rec: dict) -> str:
    s = rec["setting"]
    if "speculative" not in s:
        return rec["engine"] + (" (A/A)" if TWIN in rec["engine"] else "")
    text = f"{rec['engine']} {s['speculative']} k={s['num_speculative_tokens']}"
    text += f" α={s['scripted_acceptance']}" if "scripted_acceptance" in s else ""
    return text + (f" switch>{s['speculative_disable_by_batch_size']}" if "speculative_disable_by_batch_size" in s else "")


def cell(m: dict, key: str, fmt: str) -> str:
    return format(m[key], fmt) if key in m else "–"


def sources(runs: list[dict], file: str) -> str:
    """One line for the runs of one file (a record of each): each part's commit, run, day, repeats."""
    r = runs[0]
    each = ", ".join(f"`PART={part_of(x)}` (git {x['provenance']['git_sha'][:7]}, run {x['run_id']}, "
                     f"{x['provenance']['utc'][:10]}, median of {x['repeats']} repeats)" for x in runs)
    return f"\n\n_Source: `results/{r['phase']}/{file}`: {each}; {r['device']}, {r['preset']}._"


def acceptance_table(records: list[dict]) -> str:
    """The newest acceptance run of each result file, GPUs' only where one ran (the headline line
    gives every device's acceptance)."""
    files = sorted({r["file"] for r in records if r["workload"] == "acceptance"})
    gpu = [f for f in files if not f.endswith("-cpu.json")]    # a shared CPU's speed columns are noise
    runs = [newest([r for r in records if r["file"] == f], "acceptance") for f in gpu or files]
    if not runs:
        return "_No acceptance run yet: `make phase-13 bench PART=acceptance`._"
    rows = [[r["setting"]["prompts"], spec_label(r), cell(r["metrics"], "drafted_share", ".2f"),
             cell(r["metrics"], "acceptance_rate", ".2f"), cell(r["metrics"], "mean_accepted_len", ".2f"),
             cell(r["metrics"], "tokens_per_step", ".2f"),
             cell(r["metrics"], "tpot_p50_ms", ".1f"), cell(r["metrics"], "itl_ms_p50", ".1f"),
             versus(r, recs, "tpot_p50_ms"), versus(r, recs, "output_tok_s")]
            for recs in runs for r in sorted(recs, key=lambda r: r["setting"]["prompts"] != "grounded")]
    header = ["prompts", "engine", "steps drafted", "acceptance", "mean accepted len", "tokens / step", "TPOT p50 ms",
              "ITL p50 ms", "TPOT vs p12", "out tok/s vs p12"]
    return table(header, rows) + "".join(sources(recs[:1], recs[0]["file"].rsplit("/", 1)[-1]) for recs in runs)


def headline(records: list[dict], k: int = 4) -> str:
    """The line under the speed headline: what prompt lookup's drafts achieve on the real model,
    on each device it ran on (GPUs first): acceptance and tokens per target step, grounded and
    open prompts. The speed is the results headline's (p13 with drafts over p13 without, one run)."""
    files = sorted({r["file"] for r in records if r["workload"] == "acceptance"},
                   key=lambda f: (f.endswith("-cpu.json"), f))
    lines = [acceptance_line(newest([r for r in records if r["file"] == f], "acceptance"), k) for f in files]
    return " ".join(line for line in lines if line) or \
        "_No acceptance run yet: `make phase-13 bench PART=acceptance`._"


def acceptance_line(recs: list[dict], k: int) -> str | None:
    """One run's prompt lookup at k drafts: acceptance and tokens per step, grounded and open."""
    mine = {r["setting"]["prompts"]: r for r in recs if r["setting"].get("speculative") == "ngram"
            and r["setting"].get("num_speculative_tokens") == k}
    if set(mine) != set(PROMPT_SETS):
        return None
    g, o, first = mine["grounded"]["metrics"], mine["open"]["metrics"], mine["grounded"]
    return (f"**{first['device']}, {first['dtype']}: prompt lookup (k = {k}) on the real SmolLM2 keeps "
            f"{g['acceptance_rate']:.2f} of its drafts on grounded prompts, {o['acceptance_rate']:.2f} on open-ended "
            f"ones**, {g['tokens_per_step']:.2f} and {o['tokens_per_step']:.2f} tokens per target step (greedy, "
            f"{MAX_TOKENS[first['scale']]} new tokens, six prompts each, git {first['provenance']['git_sha'][:7]}).")


def speed_table(records: list[dict], phase: str, device: str = "NVIDIA H200", k: int = 4,
                alphas: tuple[float, ...] | None = None) -> str:
    """The newest speed run of each batch size of `phase` (p13: its speed-N parts; p14: the same
    sweep with and without graphs), every ratio over the previous phase's engine of that run. The
    scripted rows at `k` drafted tokens (and asked acceptances `alphas`, default all) only:
    RUNS.md lists the whole sweep."""
    rows, used = [], []
    mine = [r for r in records if r["file"].startswith(f"results/{phase}/")
            and r["file"].rsplit("/", 1)[-1].startswith("speed-")]
    for workload in ("latency", "concurrency"):
        for size in sorted({r["setting"].get("concurrency", 1) for r in mine
                            if r["workload"] == workload and r["device"] == device}):
            key = {"batch": 1} if workload == "latency" else {"concurrency": size}
            recs = newest([r for r in mine if bench.workload_setting(r) == key], workload, device=device)
            used += recs[:1]
            shown = [r for r in recs if in_table(r["setting"], k, alphas)]
            rows += [[str(size), spec_label(r), cell(r["metrics"], "acceptance_rate", ".2f"),
                      cell(r["metrics"], "tokens_per_step", ".2f"), cell(r["metrics"], "tpot_p50_ms", ".2f"),
                      versus(r, recs, "tpot_p50_ms"), versus(r, recs, "output_tok_s")] for r in shown]
    number = phase[1:3]
    if not rows:
        parts = "speed-1` (and speed-4, speed-16, speed-64)" if number == "13" else "speculation`"
        return f"_No speed run on {device} yet: `make phase-{number} bench PART={parts} await an H200._"
    previous = f"p{int(number) - 1:02d}"
    header = ["batch", "engine (asked α)", "measured acceptance", "tokens / step", "TPOT p50 ms",
              f"TPOT vs {previous}", f"out tok/s vs {previous}"]
    return table(header, rows) + sources(used, f"speed-{device_tag(device)}.json")


def in_table(setting: dict, k: int, alphas: tuple[float, ...] | None) -> bool:
    """Baselines always; speculative rows at k drafted tokens and, if given, these acceptances."""
    if "num_speculative_tokens" not in setting:
        return True
    return setting["num_speculative_tokens"] == k and (alphas is None or setting.get("scripted_acceptance") in alphas)


# The README's speed table keeps a low, the headline's and a high acceptance (the notebook has all).
README_ALPHAS = {"p13_speculative_decoding": (0.3, 0.8, 0.95)}


def update_readme(phase: str, check: bool = False) -> bool:
    """Rewrite the README's spec-decode markers from results/<phase>/; whether they were stale."""
    records = read_records(phase)
    texts = {"headline": headline(records), "acceptance": acceptance_table(records),
             "speed": speed_table(records, phase, alphas=README_ALPHAS.get(phase))}
    return fill_readme_blocks(phase, "spec-decode", texts, check)


# --- the command ------------------------------------------------------------------------------------
def main(argv=None, part: str | None = None, make_command: str | None = None) -> list[dict]:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    run = {"run_id": uuid.uuid4().hex[:12], "part": part, "make_command": make_command}
    with bench.pinned_cores(True, args.device):
        records = (acceptance if args.measure == "acceptance" else speed)(args, run)
    for r in records:
        m = r["metrics"]
        print(f"[spec] {spec_label(r):<48} {r['workload']:<11} {bench.workload_setting(r) or r['setting'].get('prompts')}"
              f"  acceptance {m.get('acceptance_rate', 0):.2f}  TPOT {m['tpot_p50_ms']:.2f} ms  "
              f"{m['output_tok_s']:.1f} tok/s  vs prev: {versus(r, records, 'tpot_p50_ms')}", flush=True)
    return records


def parse_args(argv):
    p = runner_args.parser(__doc__, "p13_speculative_decoding", "p12,p12#2,p13 speculative=ngram", "<acceptance|speed>")
    p.add_argument("measure", choices=["acceptance", "speed"])
    p.add_argument("--file", default=None, help="result file stem under results/<phase>/ (default: the measure)")
    p.add_argument("--batches", default="1", help="speed: comma-separated batch sizes")
    p.add_argument("--acceptances", default="0.3,0.6,0.8,0.95", help="speed: the scripted acceptance per token")
    p.add_argument("--ks", default="2,4,8", help="speed: tokens drafted per step")
    p.add_argument("--switch", default="default", help="speed: speculative_disable_by_batch_size values "
                   "('default' keeps the engine's)")
    args = runner_args.finish(p, argv)
    args.repeats = args.repeats or 3
    args.batches, args.ks = [int(b) for b in args.batches.split(",")], [int(k) for k in args.ks.split(",")]
    args.acceptances = [float(a) for a in args.acceptances.split(",")]
    args.switch = [None if s == "default" else int(s) for s in args.switch.split(",")]
    return args


if __name__ == "__main__":
    if sys.argv[1:2] == ["readme"]:          # python -m common.spec_decode readme <phase>
        update_readme(sys.argv[2])
    else:
        main()
