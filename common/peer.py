"""The peer engine, nano-vllm, measured on this project's workloads on the same machine start.

nano-vllm (github.com/GeeeekExplorer/nano-vllm: ~1.2k lines, CUDA graphs, FlashAttention) is the
engine the later phases are measured against. Its code never enters this repository: put its
public `nanovllm/` package in `.nv/` and its runner scripts in `.nvtools/` (both git-ignored;
`.nvtools/run.sh SIZE OUTDIR` builds a Qwen3 checkpoint of the llama-1b or llama-8b shape and
runs nano-vllm's own LLM on common.workloads' offline, 64-in-flight and batch-1 workloads, with
its own repeats, and writes one JSON). This module runs that in a subprocess and turns its JSON
into this project's records, so that the peer's numbers are produced by
`make phase-NN bench PART=nano-vllm` like every other committed number.

Its numbers are not same-run ratios: the peer runs in its own process after (or before) the
phase's parts, on the same machine start. Read them beside the phase's absolute numbers, with
their min-max, never as a ratio with an A/A range.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import uuid
from pathlib import Path

import torch

from .results import RESULTS, ROOT, device_tag, provenance, write_records

PRESETS = {"1b": "llama-1b", "8b": "llama-8b"}
# the peer's workload names -> (this project's workload, setting, metric)
WORKLOADS = {"offline": ("offline", {}, "output_tok_s"),
             "concurrency64": ("concurrency", {"concurrency": 64}, "output_tok_s"),
             "latency": ("latency", {"batch": 1}, "decode_tok_s")}


def part(phase: str, size: str):
    """A bench part (common.bench_set) that runs the peer at `size` ("1b" or "8b")."""
    def run(rest: list[str], command: str) -> None:
        measure(phase, size, command)
    run.preset = PRESETS[size]
    return run


def measure(phase: str, size: str, command: str) -> list[dict]:
    if not (ROOT / ".nv" / "nanovllm").is_dir() or not (ROOT / ".nvtools" / "run.sh").is_file():
        raise SystemExit("the peer needs nano-vllm's package in .nv/nanovllm and its runner in .nvtools/ "
                         "(see common/peer.py)")
    if not torch.cuda.is_available():
        raise SystemExit("the peer runs on a CUDA GPU only")
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(["bash", ".nvtools/run.sh", size, out], cwd=ROOT, check=True)
        raw = json.loads((Path(out) / f"nano-vllm-{size}.json").read_text())
    device = torch.cuda.get_device_name()
    records = to_records(raw, phase, PRESETS[size], device, command)
    write_records(RESULTS / phase / f"peer-{device_tag(device)}.json", records)
    for rec in records:
        m, (lo, hi) = rec["metrics"], rec["spread"][rec["metric"]]
        print(f"nano-vllm {rec['preset']} {rec['workload']}: {m[rec['metric']]:,.1f} ({lo:,.1f}-{hi:,.1f})")
    return records


def to_records(raw: dict, phase: str, preset: str, device: str, command: str) -> list[dict]:
    """The peer's {workload: {metric: [samples], median}} -> one record per workload."""
    run_id, prov = uuid.uuid4().hex[:12], provenance(device) | {"make_command": command}
    records = []
    for name, (workload, setting, metric) in WORKLOADS.items():
        samples = raw[name][metric]
        records.append({"phase": phase, "engine": "nano-vllm", "workload": workload, "preset": preset,
                        "dtype": "bfloat16", "scale": "full", "setting": setting, "device": device,
                        "run_id": run_id, "repeats": len(samples), "metric": metric,
                        "metrics": {metric: statistics.median(samples)},
                        "spread": {metric: [min(samples), max(samples)]},
                        "samples": {metric: samples}, "provenance": prov})
    return records
