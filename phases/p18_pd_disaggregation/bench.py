"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each comparison runs in one process, interleaved and repeated, its baseline built twice (the A/A
control). Disaggregation's claim is isolation: a long prompt prefilled on P does not stall the
streams decoding on D, at the price of a transfer in each TTFT. So:
  "long-mix"    p11's mixed workload (steady decode streams, Poisson long prompts) on llama-1b:
                p17 with chunked prefill (budget 2048, twice: A/A) against the pair (one GPU:
                P and D share it, the K/V moves over CUDA IPC): ITL p50/p99 of the streams, TTFT
  "ttft-split"  one request at a time, prompts of 512-16k tokens: the pair's TTFT split into P's
                prefill, the transfer and D's first step, beside p17's TTFT (twice: A/A)
  "transfer"    the pair alone over request sizes of 128-32k tokens: transfer time and GB/s (on
                a CPU: gloo, SmolLM2's shape, 64-1024 tokens)
A split's phases, per request, from D's timeline (disaggregated.py): prefill = arrival -> P
sampled the first token (P's queue, its prefill, the message to P); transfer = that -> the K/V
landed in D's blocks (the message back, D's reservation, the bytes); first step = landed -> D's
first decoded token. TTFT = prefill + transfer: D streams the first token when the K/V has landed.
"""
from __future__ import annotations

import sys
import uuid

from common import long_mix
from common.bench_set import aa, run_parts
from common.device import default_device, device_name, parse_dtype
from common.engines import make_engine
from common.loader import resolve
from common.results import RESULTS, device_tag, provenance, write_records
from common.stats import summarize
from common.workloads import greedy

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p18"
PREVIOUS = f"p{int(ENGINE[1:]) - 1:02d}"                    # "p17"
PD = f"{ENGINE} disaggregation=pd"
REPEATS = 5


def mix(name: str, preset: str, options: str, *extra: str):
    """long-mix: the colocated engine with chunked prefill (A/A) against the pair, both with `options`."""
    engines = aa(f"{PREVIOUS} {options},{PD} {options}")

    def part(rest: list[str], command: str) -> None:
        long_mix.main(["--phase", PHASE, "--presets", preset, "--engines", engines, *extra, *rest],
                      part=name, make_command=command)
    part.preset, part.engines = preset, engines.split(",")
    return part


def split(name: str, preset: str, lengths: tuple[int, ...], colocated: bool):
    """One request at a time per prompt length: the pair's TTFT phases (and p17's TTFT, A/A)."""
    def part(rest: list[str], command: str) -> None:
        device = rest[rest.index("--device") + 1] if "--device" in rest else default_device()
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
        per_token = resolve(preset).config.kv_bytes_per_token(parse_dtype(dtype))
        pool = {"kv_cache_bytes": 2 * max(lengths) * per_token, "max_num_seqs": 4, "max_model_len": max(lengths) + 16}
        specs = [PD] + ([PREVIOUS, PREVIOUS + "#2"] if colocated else [])
        engines = {spec: make_engine(spec.split()[0].split("#")[0], preset, device, dtype,
                                     **pool, **({"disaggregation": "pd"} if spec == PD else {})) for spec in specs}
        run = {"run_id": uuid.uuid4().hex[:12], "part": name, "make_command": command}
        try:
            records = [record(spec, preset, dtype, device, n, samples, run, per_token)
                       for n in lengths for spec, samples in measure(engines, n).items()]
        finally:
            for engine in engines.values():
                getattr(engine, "shutdown", lambda: None)()
        out = RESULTS / PHASE / f"{name}-{device_tag(device_name(device))}.json"
        write_records(out, records)
        for r in records:
            print(f"[bench] {r['engine']:<6} {r['preset']} {r['setting']['prompt_len']:>6} tokens: " +
                  "  ".join(f"{k} {v:.2f}" for k, v in r["metrics"].items()))
        print(f"[bench] run {run['run_id']}: wrote {len(records)} records to {out}")
    return part


def measure(engines: dict, n: int) -> dict[str, list[dict]]:
    """REPEATS samples per engine, interleaved; a cold prefix cache for every request."""
    prompt = [(7 * i) % 1000 + 1 for i in range(n)]
    samples = {spec: [] for spec in engines}
    for engine in engines.values():
        engine.generate([prompt], greedy(2))             # warm-up: this length's kernels, the channel
    for rep in range(REPEATS):
        for spec, engine in engines.items():
            engine.reset_prefix_cache()
            [out] = engine.generate([prompt], greedy(2))
            sample = {"repeat": rep, "ttft_ms": 1e3 * (out.token_times[0] - out.arrival_time)}
            if hasattr(engine, "pd") and engine.pd is not None:
                sample |= phases_ms(engine.pd.timeline[max(engine.pd.timeline)], out)
            samples[spec].append(sample)
    return samples


def phases_ms(t: dict, out) -> dict:
    return {"prefill_ms": 1e3 * (t["prefilled"] - t["arrival"]), "transfer_ms": 1e3 * (t["landed"] - t["prefilled"]),
            "first_step_ms": 1e3 * (out.token_times[1] - t["landed"])}


def record(spec: str, preset: str, dtype: str, device: str, n: int, samples: list[dict], run: dict,
           per_token: int) -> dict:
    if "transfer_ms" in samples[0]:                      # the bytes a request's K/V is, over its time
        for s in samples:
            s["transfer_gb_s"] = n * per_token / (s["transfer_ms"] * 1e-3) / 1e9
    metrics, spread = summarize(samples)
    name = spec.split()[0]
    return {"phase": PHASE, "engine": name, "workload": "pd-split", "preset": preset, "dtype": dtype, "scale": "full",
            "setting": {"prompt_len": n, "kv_bytes": n * per_token, **({"disaggregation": "pd"} if spec == PD else {})},
            "device": device_name(device), "run_id": run["run_id"], "part": run["part"], "repeats": len(samples),
            "metrics": metrics, "spread": spread, "samples": samples,
            "provenance": provenance(device_name(device)) | {"make_command": run["make_command"]}}


GPU_PARTS = {
    "long-mix": mix("long-mix", "llama-1b", "max_num_batched_tokens=2048"),
    "ttft-split": split("ttft-split", "llama-1b", (512, 2048, 8192, 16384), colocated=True),
    "transfer": split("transfer", "llama-1b", (128, 512, 2048, 8192, 32768), colocated=False),
}
CPU_PARTS = {
    "long-mix": mix("long-mix", "tiny-llama", "max_num_batched_tokens=64 max_num_seqs=32", "--scale", "small"),
    "ttft-split": split("ttft-split", "tiny-llama", (16, 64, 256), colocated=True),
    "transfer": split("transfer", "smollm2-135m", (64, 256, 1024), colocated=False),
}


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
