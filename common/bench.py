"""The bench harness: one workload, several engines and presets, one JSON file.

  python -m common.bench --phase p01_serial_decode --workload latency \
      --presets smollm2-135m,llama-1b --engines p01,hf-generate
  python -m common.bench --phase p02_paged_kv --workload concurrency --concurrency 1,8,32,64 \
      --presets llama-1b --engines p01,p02,hf-generate

prints one standard line per (engine, preset, setting) and writes
results/<phase>/<workload>-<device>.json.
"""
from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import time
from pathlib import Path

import torch
from tqdm import tqdm

from . import roofline, workloads
from .device import check_device, default_device, default_dtype, device_name, parse_dtype, synchronize
from .engines import HF_ENGINES, make_engine
from .loader import resolve
from .results import RESULTS, device_tag, provenance, write_records


WARMUP_REQUESTS = 8     # at least one per replica (p04 runs 2)


def latency_sample(engine, work, device: str) -> dict:
    """One batch-1 run: prefill time and steady decode tok/s from the per-token times."""
    synchronize(device)
    out = engine.generate(work.prompts, work.params)[0]
    t = out.token_times
    return {"prefill_ms": 1e3 * (t[0] - out.arrival_time), "decode_tok_s": (len(t) - 1) / (t[-1] - t[0]),
            "num_tokens": len(out.token_ids)}


def interleaved_latency(engines: dict, work, repeats: int, device: str) -> dict[str, list[dict]]:
    """Samples per engine, repeats interleaved (A B C A B C ...): at batch 1 the step time is set
    by the host's launch rate and the GPU's clocks, which drift over minutes, so engines compared
    side by side must share the drift rather than run in separate minutes."""
    for engine in engines.values():
        engine.generate(work.prompts, work.params)        # warm-up (and compile, for hf-static)
    samples = {name: [] for name in engines}
    for _ in tqdm(range(repeats), desc="repeats", leave=False):
        for name, engine in engines.items():
            samples[name].append(latency_sample(engine, work, device))
    return samples


def latency_metrics(samples: list[dict]) -> dict:
    decode = statistics.median(s["decode_tok_s"] for s in samples)
    return {"decode_tok_s": decode, "ms_per_token": 1e3 / decode,
            "prefill_ms": statistics.median(s["prefill_ms"] for s in samples)}


def offline_metrics(engine, work, device: str) -> tuple[dict, list[dict]]:
    """Throughput of the whole request set submitted at once."""
    # Warm-up: a few short requests, so that a router spreads them over every replica of a
    # data-parallel engine (one request warms one replica, and the other's first prefill is slow).
    warm = work.prompts[:WARMUP_REQUESTS]
    engine.generate(warm, [workloads._greedy(8)] * len(warm))
    # An engine whose model lives in worker processes allocates nothing in this one.
    track_memory = device.startswith("cuda") and not getattr(engine, "runs_in_workers", False)
    if track_memory:
        torch.cuda.reset_peak_memory_stats()
    synchronize(device)
    start = time.perf_counter()
    outs = engine.generate(work.prompts, work.params, use_tqdm=True)
    synchronize(device)
    wall = time.perf_counter() - start
    out_tokens = sum(len(o.token_ids) for o in outs)
    if out_tokens != work.output_tokens:
        raise RuntimeError(f"engine produced {out_tokens} tokens, workload asked for {work.output_tokens}")
    metrics = {"output_tok_s": out_tokens / wall, "total_tok_s": (out_tokens + work.prompt_tokens) / wall,
               "requests_per_s": len(outs) / wall, "wall_s": wall, "num_requests": len(outs),
               "output_tokens": out_tokens, "prompt_tokens": work.prompt_tokens}
    if track_memory:
        metrics["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    ttfts = sorted(o.ttft for o in outs)
    metrics["ttft_s_p50"] = ttfts[len(ttfts) // 2]
    itls = [x for o in outs for x in o.itl]
    if itls:   # with every request in flight, one inter-token latency is one decode step
        metrics["itl_ms_p50"] = 1e3 * statistics.median(itls)
    return metrics, [{"wall_s": wall}]


def add_roofline(metrics: dict, preset: str, dtype: str, work, hw: dict) -> None:
    """Fraction of the bandwidth floor reached by a batch-1 decode step at mean context."""
    cfg = resolve(preset).config
    n = work.params[0].max_tokens
    context = len(work.prompts[0]) + n // 2
    floor = roofline.decode_floor_s(cfg, parse_dtype(dtype), context, hw["copy_bytes_per_s"])
    metrics["roofline_ms_per_token"] = 1e3 * floor
    metrics["roofline_frac"] = 1e3 * floor / metrics["ms_per_token"]


def run_one(engine_name, preset, args, work, hw, setting: dict) -> dict:
    # The HF baseline batches by padding: at concurrency c it runs the c requests as one batch.
    options = {"batch_size": setting["concurrency"]} if engine_name in HF_ENGINES and "concurrency" in setting else {}
    options |= phase_options(engine_name, args)
    engine = make_engine(engine_name, preset, args.device, args.dtype, **options)
    metrics, samples = offline_metrics(engine, work, args.device)
    del engine
    free_memory(args.device)
    return record(engine_name, preset, args, setting | phase_options(engine_name, args), metrics, samples, hw)


def run_latency(engine_names, preset, args, work, hw) -> list[dict]:
    """Every engine's batch-1 latency on one preset, measured interleaved."""
    engines = {name: make_engine(name, preset, args.device, args.dtype, **phase_options(name, args))
               for name in engine_names}
    repeats = args.repeats or workloads.LATENCY_REPEATS[args.scale]
    records = []
    for name, samples in interleaved_latency(engines, work, repeats, args.device).items():
        metrics = latency_metrics(samples)
        add_roofline(metrics, preset, args.dtype, work, hw)
        records.append(record(name, preset, args, {"batch": 1} | phase_options(name, args), metrics, samples, hw))
    del engines
    free_memory(args.device)
    return records


def phase_options(engine_name: str, args) -> dict:
    """--engine-options go to the run's phase engines (not to HF baselines), and into the record's
    setting: the same engine with other options is another measurement."""
    return {} if engine_name in HF_ENGINES else args.engine_options


def parse_engine_options(text: str) -> dict:
    """"parallel=replica,world_size=2" -> {"parallel": "replica", "world_size": 2}."""
    options = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--engine-options takes key=value[,key=value...], got {item!r}")
        options[key] = int(value) if value.lstrip("-").isdigit() else value
    return options


def record(engine_name, preset, args, setting, metrics, samples, hw) -> dict:
    return {"phase": args.phase, "engine": engine_name, "workload": args.workload, "preset": preset,
            "dtype": args.dtype, "scale": args.scale, "setting": setting,
            "device": device_name(args.device), "metrics": metrics, "samples": samples, "hardware": hw,
            "provenance": provenance(device_name(args.device))}


def free_memory(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def standard_line(rec: dict) -> str:
    m = rec["metrics"]
    where = f"C={rec['setting']['concurrency']:<3}" if "concurrency" in rec["setting"] else ""
    where += "".join(f"{k}={v} " for k, v in rec["setting"].items() if k not in ("concurrency", "batch"))
    head = f"[bench] {rec['engine']:<12} {rec['workload']:<8} {where}{rec['preset']:<13} {rec['dtype']:<8} {rec['device']}:"
    if rec["workload"] == "latency":
        return (f"{head} {m['decode_tok_s']:8.1f} tok/s  {m['ms_per_token']:7.2f} ms/token  "
                f"prefill {m['prefill_ms']:7.1f} ms  {100 * m['roofline_frac']:5.1f}% of roofline")
    step = f"  {m['itl_ms_p50']:.2f} ms/step" if "itl_ms_p50" in m else ""
    return (f"{head} {m['output_tok_s']:8.1f} out tok/s  {m['total_tok_s']:8.1f} total tok/s  "
            f"{m['num_requests']} reqs in {m['wall_s']:.1f} s{step}")


def make_workloads(args) -> list[tuple[workloads.Workload, dict]]:
    """(workload, setting) pairs this run measures: one, or one per concurrency level."""
    if args.workload == "concurrency":
        return [(workloads.concurrency(c, args.scale), {"concurrency": c}) for c in args.concurrency]
    if args.workload == "latency":
        return [(workloads.latency(), {"batch": 1})]
    if args.requests:   # a non-standard size is another measurement: it goes into the setting
        return [(workloads.offline(args.scale, num_requests=args.requests), {"requests": args.requests})]
    return [(workloads.offline(args.scale), {})]


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    hw = roofline.measure(args.device)
    works = make_workloads(args)
    out = Path(args.out or RESULTS / args.phase / f"{args.workload}-{device_tag(device_name(args.device))}.json")
    records, failures = [], []

    def measure(what: str, fn) -> None:
        try:
            new = fn()
        except Exception as e:   # noqa: BLE001 - report it, keep measuring the others
            failures.append(f"{what}: {type(e).__name__}: {e}")
            print(f"[bench] FAILED {failures[-1]}", flush=True)
            return
        for rec in new:
            print(standard_line(rec), flush=True)
        records.extend(new)
        write_records(out, new)     # after every measurement: a timeout loses only the current one

    for preset in args.presets:
        if args.workload == "latency":
            measure(f"latency on {preset}", lambda: run_latency(args.engines, preset, args, works[0][0], hw))
            continue
        for engine_name, (work, setting) in itertools.product(args.engines, works):
            measure(f"{engine_name} on {preset} {setting}",
                    lambda: [run_one(engine_name, preset, args, work, hw, setting)])
    print(f"[bench] wrote {len(records)} records to {out}")
    if failures:
        raise SystemExit(f"[bench] {len(failures)} run(s) failed:\n  " + "\n  ".join(failures))
    return records


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase", required=True, help="results folder, e.g. p01_serial_decode")
    p.add_argument("--workload", choices=["latency", "offline", "concurrency"], required=True)
    p.add_argument("--concurrency", default="1,8,32,64", help="concurrency workload: comma-separated levels")
    p.add_argument("--presets", default="smollm2-135m", help="comma-separated presets or HF dirs")
    p.add_argument("--engines", required=True, help="comma-separated: p01, hf-generate, hf-static, ...")
    p.add_argument("--scale", choices=["full", "small"], default="full")
    p.add_argument("--requests", type=int, default=None,
                   help="offline workload: this many requests instead of the scale's (same distributions)")
    p.add_argument("--repeats", type=int, default=None, help="latency repeats (default by scale)")
    p.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--out", default=None, help="result file (default results/<phase>/<workload>-<device>.json)")
    p.add_argument("--engine-options", default="", help="key=value,... for every phase engine of the run "
                   "(e.g. parallel=replica,world_size=2); recorded in each record's setting")
    args = p.parse_args(argv)
    try:
        args.engine_options = parse_engine_options(args.engine_options)
    except ValueError as e:
        p.error(str(e))
    args.device = check_device(args.device or default_device())
    args.dtype = args.dtype or default_dtype(args.device)
    args.presets, args.engines = args.presets.split(","), args.engines.split(",")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    if args.requests is not None and (args.requests < 1 or args.workload != "offline"):
        p.error(f"--requests takes a positive count and the offline workload, got {args.requests}")
    if min(args.concurrency) < 1:
        p.error(f"--concurrency levels must be positive, got {args.concurrency}")
    return args


if __name__ == "__main__":
    main()
