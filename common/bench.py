"""The bench harness: one workload, several engines and presets, one JSON file.

  python -m common.bench --phase p03_vectorized_gather --workload concurrency --concurrency 1,8,32,64 \
      --presets llama-1b --engines p02,p03,hf-generate

The engines of one call are one comparison, measured in one run (one run id in every record):
for each preset they are built side by side, each with a KV pool sized for the workload so that
they share the device, warmed up on the workload itself in short (common.measure.warm_up: its
requests, a few new tokens each, so that round 0 is no cold start), and then measured in repeat
rounds, interleaved: in round i every engine runs every setting once, the engines' order rotated
by one each round (A B C, B C A, C A B, ...), so that no engine always runs first or always right
after the same neighbour. The host's launch rate and the GPU's clocks drift over minutes; engines
measured in the same minutes share the drift, so the ratio of two engines is taken per round
(common.stats) and quoted with its range. Each record keeps its samples, their medians (metrics)
and min-max (spread). The engines are freed before the next preset.

An A/A control rides in every comparison: the baseline listed twice, the second time with the
suffix "#2" ("p05,p05#2,p06"), is built twice the same way and measured like the others. The
ratio of the two identical engines is the run's noise; every record of the setting carries it
("aa"), and common.stats calls a ratio a gain only where it clears that range.

Noise control (--noise-control, on unless "off"): a full collection, then the garbage collector
frozen and off while a sample runs (a collection inside a timed step is a host stall the engines
do not own), and on a GPU host the process pinned to a fixed set of cores (no migration between
cores mid-run). An explicit --noise-control on|off goes into the records' setting, so one part
can keep both and compare their A/A ranges.

Committed results come from `make phase-NN bench PART=...` (run_parts below), which names the make
command and the part in every record's provenance.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import sys
import uuid
from pathlib import Path

import torch
from tqdm import tqdm

from . import measure, roofline, stats, workloads
from .device import check_device, default_device, default_dtype, device_name, parse_dtype
from .engines import HF_ENGINES, make_engine, phase_folder
from .loader import resolve
from .report import engine_label, twin_label
from .results import RESULTS, device_tag, move_aside, provenance, write_records


def compare(preset: str, args, works: list, hw: dict, run: dict, out: Path) -> list[dict]:
    """Every engine on every (workload, setting) of one preset, interleaved; records per engine
    and setting, rewritten after every round (a timeout loses only the round in flight)."""
    engines, resident = build_engines(preset, args, works)
    try:
        for name, engine in engines.items():
            for work, setting in works:
                configure(engine, name, setting)
                measure.warm_up(engine, work)
        samples = {(name, i): [] for name in engines for i in range(len(works))}
        for rep in tqdm(range(repeats(args)), desc=f"{preset} rounds", leave=False):
            for i, (work, setting) in enumerate(works):
                for name in rotated(list(engines), rep):
                    engine = engines[name]
                    configure(engine, name, setting)
                    with quiet_gc(args.noise_control != "off"):
                        sample = take_sample(engine, work, args.device)
                    samples[name, i].append({"repeat": rep, **sample})
            records = [record(name, preset, args, works[i], samples[name, i], hw, run, resident.get(name))
                       | engine_facts(engines[name]) for name in engines for i in range(len(works))]
            write_records(out, with_aa(records))
        return records
    finally:
        close(engines)


def rotated(names: list[str], round_index: int) -> list[str]:
    """Round i's order: the names rotated left by i (A B C, B C A, C A B, A B C, ...)."""
    k = round_index % len(names)
    return names[k:] + names[:k]


def build_engines(preset: str, args, works: list) -> tuple[dict, dict]:
    """{name: engine} and {name: GiB it holds on the device} (weights + KV pool; GPU only)."""
    engines, resident = {}, {}
    for name in args.engines:
        before = measure.memory_allocated(args.device)
        options = sized_options(name, preset, args, works)
        engines[name] = make_engine(engine_name(name), preset, args.device, args.dtype, **options)
        if args.device.startswith("cuda") and not getattr(engines[name], "runs_in_workers", False):
            resident[name] = (measure.memory_allocated(args.device) - before) / 2**30
        warn_if_auto_fell_back(name, engines[name], args.device)
    return engines, resident


def warn_if_auto_fell_back(name: str, engine, device: str) -> None:
    """On a GPU, "auto" means FlashAttention where it is installed; where it is not, say so before
    any number is taken: the records would otherwise measure another attention path unnoticed."""
    backend = engine_facts(engine).get("engine_facts", {}).get("attention_backend")
    if device.startswith("cuda") and backend not in (None, "flash-attn") and "attention_backend" not in name:
        print(f"[bench] note: {name} runs attention on {backend}: FlashAttention is not installed here "
              "(see the phase README); its records say so (engine_facts)", file=sys.stderr)


def sized_options(name: str, preset: str, args, works: list) -> dict:
    """The run's --engine-options, plus a KV budget the workload can fill for phase engines with
    a paged pool (a pool of 90% of free memory would leave nothing for the next engine)."""
    options = dict(phase_options(name, args))
    if engine_name(name) in HF_ENGINES or "kv_cache_bytes" in options:
        return options
    config = importlib.import_module(f"phases.{phase_folder(engine_name(name))}.config").EngineConfig
    if "kv_cache_bytes" in config.__dataclass_fields__:
        options["kv_cache_bytes"] = measure.kv_budget_bytes(preset, parse_dtype(args.dtype), [w for w, _ in works])
    return options


def configure(engine, name: str, setting: dict) -> None:
    """The HF baseline batches by padding: at concurrency c it runs the c requests as one batch."""
    if engine_name(name) in HF_ENGINES:
        engine.batch_size = setting.get("concurrency", 1)


def take_sample(engine, work, device: str) -> dict:
    if work.name == "latency":
        return measure.latency_sample(engine, work, device)
    return measure.throughput_sample(engine, work, device)


def close(engines: dict) -> None:
    """Stop worker processes and free every engine's device memory before the next preset."""
    for engine in engines.values():
        if hasattr(engine, "shutdown"):
            engine.shutdown()
    engines.clear()
    free_memory()


def free_memory(device: str | None = None) -> None:
    """Give freed tensors back to the device, so the next engine finds the memory."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def repeats(args) -> int:
    return args.repeats or workloads.REPEATS[args.workload][args.scale]


def engine_name(spec: str) -> str:
    """An engine spec is a name and its own options: "p04 parallel=replica world_size=2"; the
    name may carry an instance suffix, "p05#2" (the A/A control's twin), which builds "p05"."""
    return instance_name(spec).partition("#")[0]


def instance_name(spec: str) -> str:
    """The engine as records name it: "p05", or "p05#2" for the A/A control's second instance."""
    return spec.split()[0]


def twin_spec(spec: str) -> str:
    """The A/A control of an engine spec: "p06 attention_backend=torch" -> "p06#2 attention_backend=torch"."""
    name, *options = spec.split()
    return " ".join([name + stats.TWIN, *options])


# --- noise control --------------------------------------------------------------------------------
PIN_CORES = 8          # a GPU host's bench process keeps to this many cores (the lowest ids it may use)


@contextlib.contextmanager
def quiet_gc(on: bool = True):
    """Collect now, then no collection while the body runs (a sample): gc.freeze() moves every
    live object out of the collector's sight, gc.disable() stops the automatic passes."""
    if not on:
        yield
        return
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


@contextlib.contextmanager
def pinned_cores(on: bool, device: str):
    """On a GPU host, pin this process (and the workers it starts) to a fixed set of cores for the
    body, then give the old set back. A CPU run keeps every core: its compute is the measurement."""
    if not (on and device.startswith("cuda") and hasattr(os, "sched_setaffinity")):
        yield None
        return
    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    cores = sorted(before)[:PIN_CORES]
    try:
        os.sched_setaffinity(0, cores)
    except OSError as e:            # a sandbox may refuse: measure unpinned, and say so
        print(f"[bench] cannot pin to cores {cores[0]}-{cores[-1]} ({e}): running unpinned", flush=True)
        yield None
        return
    torch.set_num_threads(min(threads, len(cores)))   # no more compute threads than cores to run them
    try:
        yield cores
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)


def phase_options(spec: str, args) -> dict:
    """--engine-options and the spec's own options go to phase engines (not to HF baselines), and
    into the record's setting: the same engine with other options is another measurement."""
    if engine_name(spec) in HF_ENGINES:
        return {}
    return args.engine_options | parse_engine_options(",".join(spec.split()[1:]))


# --- records ------------------------------------------------------------------------------------
def record(name, preset, args, work_setting, samples, hw, run, resident_gib) -> dict:
    work, setting = work_setting
    metrics, spread = stats.summarize(samples)
    metrics.pop("num_tokens", None)
    if work.name == "latency":
        metrics["ms_per_token"] = 1e3 / metrics["decode_tok_s"]   # the median rate's, not a mean of two
        add_roofline(metrics, preset, args.dtype, work, hw, phase_options(name, args))
    else:
        metrics |= {"num_requests": len(work.requests), "output_tokens": work.output_tokens,
                    "prompt_tokens": work.prompt_tokens}
        if resident_gib is not None and "run_peak_gib" in metrics:
            metrics["peak_mem_gib"] = resident_gib + metrics["run_peak_gib"]
    noise = {"noise_control": args.noise_control} if args.noise_control_explicit else {}
    return {"phase": args.phase, "engine": instance_name(name), "workload": args.workload, "preset": preset,
            "dtype": args.dtype, "scale": args.scale, "setting": setting | phase_options(name, args) | noise,
            "device": device_name(args.device), "run_id": run["run_id"], "part": run["part"],
            "repeats": len(samples), "metrics": metrics, "spread": spread, "samples": samples, "hardware": hw,
            "noise_control": {"gc_frozen": args.noise_control != "off", "cpus": run.get("cpus")},
            "provenance": provenance(device_name(args.device)) | {"make_command": run["make_command"]}}


def engine_facts(engine) -> dict:
    """What an engine reports of its own start-up, under "engine_facts": the attention backend
    "auto" resolved to (FlashAttention only where it imports: a record says which one ran) and,
    for a CUDA-graph engine, its buckets, capture seconds and graph memory."""
    facts = dict(getattr(engine, "graph_stats", None) or {})
    backend = getattr(getattr(getattr(engine, "runner", None), "backend", None), "name", None)
    facts |= {"attention_backend": backend} if backend else {}
    return {"engine_facts": facts} if facts else {}


def main_metric(workload: str) -> str:
    return "decode_tok_s" if workload == "latency" else "output_tok_s"


def with_aa(records: list[dict]) -> list[dict]:
    """Every record gets the A/A ratio of its preset and setting ("aa": twin over baseline, per
    repeat pair, on the workload's main metric, with the baseline's label), where the run has a twin."""
    for twin in [r for r in records if stats.TWIN in r["engine"]]:
        base = next((r for r in records if twin_label(engine_label(r)) == engine_label(twin)
                     and r["preset"] == twin["preset"] and r["setting"] == twin["setting"]), None)
        key = main_metric(twin["workload"])
        aa = stats.paired_ratio(twin, base, key) if base else None
        for r in records if aa else []:
            if r["preset"] == twin["preset"] and workload_setting(r) == workload_setting(twin):
                r["aa"] = aa | {"metric": key, "engine": engine_label(base)}
    return records


def workload_setting(rec: dict) -> dict:
    """The setting without the engines' own options: what engines of one comparison share."""
    return {k: v for k, v in rec["setting"].items() if k in SHARED_SETTINGS}


SHARED_SETTINGS = ("batch", "concurrency", "requests", "prompt_len", "noise_control")


def add_roofline(metrics: dict, preset: str, dtype: str, work, hw: dict, options: dict) -> None:
    """Fraction of the bandwidth floor reached by a batch-1 decode step at mean context (an engine
    with quantization= reads its Linears in 8 bits). The bytes are kept too, so a report can divide
    them by one bandwidth figure per machine."""
    cfg = resolve(preset).config
    context = len(work.prompts[0]) + work.params[0].max_tokens // 2
    floor = roofline.decode_floor_s(cfg, parse_dtype(dtype), context, hw["copy_bytes_per_s"],
                                    linear_elem=1 if options.get("quantization") else None)
    metrics["floor_bytes"] = floor * hw["copy_bytes_per_s"]
    metrics["roofline_ms_per_token"] = 1e3 * floor
    metrics["roofline_frac"] = 1e3 * floor / metrics["ms_per_token"]


def standard_line(rec: dict) -> str:
    m, lo_hi = rec["metrics"], rec["spread"]
    where = f"C={rec['setting']['concurrency']:<3}" if "concurrency" in rec["setting"] else ""
    where += "".join(f"{k}={v} " for k, v in rec["setting"].items() if k not in ("concurrency", "batch"))
    head = f"[bench] {rec['engine']:<12} {rec['workload']:<8} {where}{rec['preset']:<13} {rec['dtype']:<8} {rec['device']}:"
    aa = f"  {stats.format_aa(rec.get('aa'))}"
    if rec["workload"] == "latency":
        lo, hi = lo_hi["decode_tok_s"]
        return (f"{head} {m['decode_tok_s']:8.1f} tok/s ({lo:.1f}-{hi:.1f})  {m['ms_per_token']:7.2f} ms/token  "
                f"prefill {m['prefill_ms']:7.1f} ms  {100 * m['roofline_frac']:5.1f}% of roofline{aa}")
    lo, hi = lo_hi["output_tok_s"]
    step = f"  {m['itl_ms_p50']:.2f} ms/step" if "itl_ms_p50" in m else ""
    step += f"  {m['mean_in_flight']:.1f} in flight" if "mean_in_flight" in m else ""
    step += f"  {m['num_preemptions']:g} preemptions" if "num_preemptions" in m else ""
    return (f"{head} {m['output_tok_s']:8.1f} out tok/s ({lo:.1f}-{hi:.1f})  {m['total_tok_s']:8.1f} total tok/s  "
            f"{m['num_requests']} reqs in {m['wall_s']:.1f} s{step}{aa}")


def ratio_lines(records: list[dict]) -> list[str]:
    """Every engine against the first of the run, per setting, with the range over repeat pairs,
    judged against the setting's A/A range; the twin's own line is that range."""
    key = main_metric(records[0]["workload"]) if records else None
    first = engine_label(records[0]) if records else None
    lines = []
    for base in [r for r in records if engine_label(r) == first]:
        for other in records:
            if engine_label(other) == first or other["preset"] != base["preset"] or \
                    workload_setting(other) != workload_setting(base):
                continue
            ratio = stats.paired_ratio(other, base, key)
            if engine_label(other) == twin_label(first):
                text = "–" if ratio is None else f"{stats.fmt_bound(ratio['median'])}× ({stats.format_range(ratio)}) A/A control"
            else:
                text = stats.format_ratio(ratio, other.get("aa"))
            lines.append(f"[bench]   {engine_label(other)} vs {first} ({base['preset']} {base['setting']}): {text}")
    return lines


# --- the command ----------------------------------------------------------------------------------
def make_workloads(args) -> list[tuple[workloads.Workload, dict]]:
    """(workload, setting) pairs this run measures: one, or one per concurrency level."""
    if args.workload == "concurrency":   # a non-standard prompt length is another measurement, as below
        length = {"prompt_len": args.prompt_len} if args.prompt_len else {}
        return [(workloads.concurrency(c, args.scale, prompt_len=args.prompt_len), {"concurrency": c} | length)
                for c in args.concurrency]
    if args.workload == "latency":      # batch 1; a long prompt: decode over a long context
        length = {"prompt_len": args.prompt_len} if args.prompt_len else {}
        return [(workloads.latency(args.prompt_len or 32), {"batch": 1} | length)]
    if args.requests:   # a non-standard size is another measurement: it goes into the setting
        return [(workloads.offline(args.scale, num_requests=args.requests), {"requests": args.requests})]
    return [(workloads.offline(args.scale), {})]


def main(argv=None, part: str | None = None, make_command: str | None = None) -> list[dict]:
    """Run one comparison; `part` and `make_command` come from run_parts (a phase's bench set)."""
    args = parse_args(argv)
    stem = args.file or args.workload
    out = Path(args.out or RESULTS / args.phase / f"{stem}-{device_tag(device_name(args.device))}.json")
    check_out(out)
    with pinned_cores(args.noise_control != "off", args.device) as cores:
        run = {"run_id": uuid.uuid4().hex[:12], "part": part, "make_command": make_command,
               "cpus": f"{cores[0]}-{cores[-1]}" if cores else None}
        records, failures = compare_presets(args, run, out)
    print(f"[bench] run {run['run_id']}: wrote {len(records)} records to {out}")
    if failures:
        raise SystemExit(f"[bench] {len(failures)} run(s) failed:\n  " + "\n  ".join(failures))
    return records


def compare_presets(args, run: dict, out: Path) -> tuple[list[dict], list[str]]:
    """compare() for every preset of the run: (records, failures); a failed preset is reported
    and the others are still measured."""
    hw = roofline.measure(args.device)
    works = make_workloads(args)
    records, failures = [], []
    for preset in args.presets:
        try:
            new = compare(preset, args, works, hw, run, out)
        except Exception as e:   # noqa: BLE001 - report it, keep measuring the other presets
            failures.append(f"{preset}: {type(e).__name__}: {e}")
            print(f"[bench] FAILED {failures[-1]}", flush=True)
            continue
        print("\n".join([standard_line(r) for r in new] + ratio_lines(new)), flush=True)
        records.extend(new)
    return records, failures


def check_out(out: Path) -> None:
    """Refuse an output path that could not take the records before measuring anything."""
    if out.is_dir():
        raise SystemExit(f"[bench] --out {out} is a directory; give a .json file path")
    if out.exists():
        try:
            old = json.loads(out.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:   # e.g. emptied by an interrupted write
            print(f"[bench] WARNING: {out} is not readable JSON ({e}); moved it to {move_aside(out)}",
                  file=sys.stderr, flush=True)
            return
        except OSError as e:
            raise SystemExit(f"[bench] --out {out} cannot be read ({e}); move it away or choose another path") from None
        if not isinstance(old, list):
            raise SystemExit(f"[bench] --out {out} holds JSON that is not a list of records")
    elif out.parent.exists() and not out.parent.is_dir():
        raise SystemExit(f"[bench] --out {out}: {out.parent} is not a directory")


def parse_engine_options(text: str) -> dict:
    """"parallel=replica,world_size=2" -> {"parallel": "replica", "world_size": 2}."""
    options = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--engine-options takes key=value[,key=value...], got {item!r}")
        options[key] = int(value) if value.lstrip("-").isdigit() else value
    return options


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase", required=True, help="results folder, e.g. p01_serial_decode")
    p.add_argument("--workload", choices=["latency", "offline", "concurrency"], required=True)
    p.add_argument("--concurrency", default="1,8,32,64", help="concurrency workload: comma-separated levels")
    p.add_argument("--presets", default="smollm2-135m", help="comma-separated presets or HF dirs")
    p.add_argument("--engines", required=True, help="comma-separated: p01, hf-generate, hf-static, ...; a phase "
                   "engine may carry its own options: \"p03,p04 parallel=replica world_size=2\"")
    p.add_argument("--scale", choices=["full", "small"], default="full")
    p.add_argument("--requests", type=int, default=None,
                   help="offline workload: this many requests instead of the scale's (same distributions)")
    p.add_argument("--prompt-len", type=int, default=None,
                   help="latency or concurrency workload: prompts of this many tokens (long contexts)")
    p.add_argument("--repeats", type=int, default=None, help="rounds of every engine (default by workload and scale)")
    p.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--out", default=None, help="result file (default results/<phase>/<file>-<device>.json)")
    p.add_argument("--file", default=None, help="result file stem under results/<phase>/ (default: the workload); "
                   "parts that share an engine and a setting need files of their own, or one replaces the other")
    p.add_argument("--noise-control", choices=["on", "off"], default=None,
                   help="gc frozen around samples and (GPU host) pinned cores; default on. Given explicitly, it "
                   "goes into each record's setting (a part that measures the A/A range with and without)")
    p.add_argument("--engine-options", default="", help="key=value,... for every phase engine of the run "
                   "(e.g. parallel=replica,world_size=2); recorded in each record's setting")
    args = p.parse_args(argv)
    try:
        args.engine_options = parse_engine_options(args.engine_options)
        args.device = check_device(args.device or default_device())
        for spec in args.engines.split(","):
            phase_options(spec, args)                       # options parse
            if engine_name(spec) not in HF_ENGINES:
                phase_folder(engine_name(spec))             # the phase exists
    except ValueError as e:
        p.error(str(e))
    args.dtype = args.dtype or default_dtype(args.device)
    args.noise_control_explicit, args.noise_control = args.noise_control is not None, args.noise_control or "on"
    args.presets, args.engines = args.presets.split(","), args.engines.split(",")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    if args.requests is not None and (args.requests < 1 or args.workload != "offline"):
        p.error(f"--requests takes a positive count and the offline workload, got {args.requests}")
    if args.prompt_len is not None and (args.prompt_len < 1 or args.workload == "offline"):
        p.error(f"--prompt-len takes a positive length and the latency or concurrency workload, got {args.prompt_len}")
    if min(args.concurrency) < 1 or (args.repeats is not None and args.repeats < 1):
        p.error(f"--concurrency levels and --repeats must be positive, got {args.concurrency}, {args.repeats}")
    return args


if __name__ == "__main__":
    main()
