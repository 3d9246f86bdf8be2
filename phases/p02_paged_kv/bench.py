"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each part is one or more comparisons run by common.bench: the engines of a comparison are
measured in one process, interleaved and repeated. On a GPU each part fits one 10-minute call;
on a CPU the same comparisons run at --scale small on small presets (common.bench_set).

Batching pays with requests in flight: the previous engine beside this one at fixed concurrency
(with HF `generate` as shipped and with cuDNN's attention ruled out) and offline (where HF would
serve the set one request at a time); batch-1 latency beside HF's compiled static cache. The
"gather" part measures the KV gather's share of a decode step.
"""
from __future__ import annotations

import statistics
import sys
import time

from common import workloads
from common.bench_set import aa, run_parts
from common.device import default_device, default_dtype, device_name, synchronize
from common.engines import make_engine
from common.results import RESULTS, device_tag, provenance, write_records
from common.sampling import SamplingParams

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p02"
PREVIOUS = f"p{int(ENGINE[1:]) - 1:02d}"                    # "p01"
HF = "hf-generate,hf-generate-nocudnn"


def latency(presets: str, scale: tuple = ()) -> list[list[str]]:
    return [["--workload", "latency", *scale, "--presets", presets, "--engines", aa(f"{PREVIOUS},{ENGINE},hf-static")]]


def concurrency(preset: str, levels: str, scale: tuple = (), engines: str = f"{PREVIOUS},{ENGINE}") -> list[list[str]]:
    return [["--workload", "concurrency", *scale, "--concurrency", levels, "--presets", preset,
             "--engines", aa(f"{engines},{HF}")]]


def offline(preset: str, scale: tuple = ()) -> list[list[str]]:
    return [["--workload", "offline", *scale, "--presets", preset, "--engines", aa(f"{PREVIOUS},{ENGINE}")]]


# Each comparison's first engine is its baseline, built twice (aa(): the A/A control). A serial p01
# takes minutes per level at 32 and 64 in flight and per offline set: p02 runs it at 1 and 8 and on
# the small set (5 requests on llama-8b), and itself alone with HF at 32 and 64. On llama-8b 1 and 8
# in flight, 32, and 64 are three parts (each fits one 10-minute call); full offline sets run twice.
SERIAL_BEFORE = PREVIOUS == "p01"
HIGH = ENGINE if SERIAL_BEFORE else f"{PREVIOUS},{ENGINE}"      # who runs at 32 and 64 in flight
GPU_PARTS = {
    "latency": latency("smollm2-135m-random,llama-1b"),
    "latency-8b": latency("llama-8b"),
    "concurrency": concurrency("llama-1b", "1,8" if SERIAL_BEFORE else "1,8,32,64"),
    "concurrency-8b": concurrency("llama-8b", "1,8"),
    **{f"concurrency-8b-{c}": concurrency("llama-8b", c, engines=HIGH) for c in ("32", "64")},
    "offline": offline("llama-1b", ("--scale", "small") if SERIAL_BEFORE else ("--repeats", "2")),
    "offline-8b": offline("llama-8b", ("--scale", "small", *(("--requests", "5") if SERIAL_BEFORE else ()))),
}
if SERIAL_BEFORE:
    GPU_PARTS["concurrency-high"] = concurrency("llama-1b", "32,64", engines=HIGH)
SMALL = ("--scale", "small")
CPU_PARTS = {
    "latency": [["--workload", "latency", *SMALL, "--presets", "tiny-llama",
                 "--engines", aa(f"{PREVIOUS},{ENGINE},hf-generate")]],
    "concurrency": [["--workload", "concurrency", *SMALL, "--concurrency", "1,8,32", "--presets", "tiny-llama",
                     "--engines", aa(f"{PREVIOUS},{ENGINE},hf-generate")]],
    "offline": offline("tiny-llama", SMALL),
}


# --- the gather part: the KV gather's share of one decode step ----------------------------------
GATHER = {"cuda": ("llama-1b", (1, 8, 32, 64), "full"), "cpu": ("tiny-llama", (1, 8, 32), "small")}
STEPS = 20                                                  # decode steps timed per level


def timed(fn, device: str) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def gather_level(llm, c: int, scale: str) -> dict:
    """c requests of the concurrency workload in flight: a whole decode step vs the step's
    2 x num_layers KV gathers alone (same sequences, same metadata), median of STEPS each."""
    params = SamplingParams(temperature=0, max_tokens=STEPS + 3, ignore_eos=True)
    for ids in workloads.concurrency(c, scale).prompts:
        llm.add_request(ids, params)
    while llm.scheduler.waiting or not all(s.output_ids for s in llm.scheduler.running):
        llm.step()                                          # prefill everyone
    steps = [timed(llm.step, llm.device) for _ in range(STEPS)]
    seqs, _ = llm.scheduler.schedule()                      # the next decode step, not run yet
    _, ctx = llm.runner.prepare_decode(seqs)
    layers = range(llm.model_config.num_layers)
    gathers = [timed(lambda: [llm.cache.gather(i, ctx) for i in layers], llm.device) for _ in range(STEPS)]
    while llm.has_unfinished():
        llm.step()
    step_ms, gather_ms = 1e3 * statistics.median(steps), 1e3 * statistics.median(gathers)
    return {"setting": {"concurrency": c}, "samples": [{"step_s": s, "gather_s": g} for s, g in zip(steps, gathers)],
            "metrics": {"step_ms": step_ms, "gather_ms": gather_ms, "gather_share": gather_ms / step_ms,
                        "context_tokens": max(ctx.context_lens)}}


def gather_share(argv: list[str], make_command: str) -> None:
    device = argv[argv.index("--device") + 1] if "--device" in argv else default_device()
    dtype = default_dtype(device)
    preset, levels, scale = GATHER["cuda" if device.startswith("cuda") else "cpu"]
    llm = make_engine(ENGINE, preset, device, dtype)
    name = device_name(device)
    out = RESULTS / PHASE / f"gather-{device_tag(name)}.json"
    for c in levels:
        rec = {"phase": PHASE, "engine": ENGINE, "workload": "gather", "preset": preset, "dtype": dtype,
               "scale": scale, "device": name, "part": "gather", **gather_level(llm, c, scale),
               "provenance": provenance(name) | {"make_command": make_command}}
        m = rec["metrics"]
        print(f"[bench] {ENGINE} gather C={c:<3} {preset} {dtype} {name}: step {m['step_ms']:.2f} ms, "
              f"gathers {m['gather_ms']:.2f} ms ({100 * m['gather_share']:.0f}%)", flush=True)
        write_records(out, [rec])


GPU_PARTS["gather"] = CPU_PARTS["gather"] = gather_share


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
