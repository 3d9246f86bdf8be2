"""Where a profiled decode step's GPU time goes, by kernel class: the map for the next phases.

`make phase-NN profile` writes a chrome trace per batch size beside its records (the record's
"trace": results/<phase>/trace-<device>-<model>-b<B>.json.gz, `steps` decode steps under torch.profiler).
This module reads one back and sums its GPU kernels by class, per decode step: weight GEMMs,
attention, norms, rotary + K/V write, other elementwise ops, sampling, copies. Against the step's
bandwidth floor it says which kernels a later phase should rewrite (attention at batch 1: split-K)
or fuse (the norms and elementwise ops around every GEMM).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from .report import table as markdown_table
from .results import RESULTS

# (class, substrings of a kernel's name): the first class that matches wins, so copies are
# taken out before "elementwise" (a copy kernel's name has both), the K/V write (an index_copy)
# before indexing, attention before GEMM (FlashAttention 4's kernels are CUTLASS kernels), and
# the GEMMs' split-K reduce counts as GEMM time.
CLASSES = [
    ("copies", ("Memcpy", "Memset", "memcpy", "direct_copy")),
    ("attention", ("paged_decode", "flash", "fmha", "attention", "attn")),
    ("GEMM", ("nvjet", "gemm", "gemv", "cutlass", "xmma", "splitKreduce")),
    ("norm", ("layer_norm", "rms_norm", "rmsnorm")),
    ("rotary + K/V write", ("rope", "rotary", "cache_kernel", "index_copy")),
    ("sampling", ("ArgMax", "argmax", "topk", "sort", "multinomial")),
    ("embedding + indexing", ("index", "gather", "embedding")),
    ("elementwise", ("elementwise", "silu", "Functor", "CatArray")),
]
OTHER = "other"
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def kernel_class(name: str) -> str:
    return next((cls for cls, keys in CLASSES if any(k in name for k in keys)), OTHER)


def read_kernels(path: Path) -> list[tuple[str, float]]:
    """(name, microseconds) of every GPU kernel, copy and memset in a (gzipped) chrome trace."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [(e["name"], float(e.get("dur", 0.0))) for e in events if e.get("cat") in GPU_CATEGORIES]


def step_map(kernels: list[tuple[str, float]], steps: int) -> dict[str, dict]:
    """Per class: GPU µs and kernel count per step, and its share of the summed kernel time."""
    if steps <= 0:
        raise ValueError(f"steps must be positive, got {steps}")
    total = sum(us for _, us in kernels) or 1.0
    out = {cls: {"us": 0.0, "count": 0.0, "share": 0.0} for cls, _ in [*CLASSES, (OTHER, ())]}
    for name, us in kernels:
        row = out[kernel_class(name)]
        row["us"] += us / steps
        row["count"] += 1 / steps
        row["share"] += us / total
    return out


def record_map(rec: dict, root: Path = RESULTS) -> dict[str, dict] | None:
    """The map of one profile record's trace, or None where the record has no trace file."""
    trace = rec.get("trace")
    path = root / rec["phase"] / trace if trace else None
    if path is None or not path.is_file():
        return None
    return step_map(read_kernels(path), int(rec["metrics"]["steps"]))


def table(records: list[dict], root: Path = RESULTS) -> str:
    """A markdown table: a row per kernel class, a column per profile record (its model and batch):
    µs per step, kernels per step and share of the GPU's kernel time."""
    maps = [(r, m) for r in records if (m := record_map(r, root))]
    if not maps:
        return "_No profile trace yet: run `make phase-NN profile` on a GPU, then `make results`._"
    header = ["kernel class", *[f"{r['preset']} batch {r['setting'].get('batch')}: µs/step (kernels, share)"
                                for r, _ in maps]]
    rows = []
    for cls in [c for c, _ in CLASSES] + [OTHER]:
        cells = [m[cls] for _, m in maps]
        if any(c["count"] for c in cells):
            rows.append([cls, *[f"{c['us']:.0f} ({c['count']:.0f}, {c['share']:.0%})" for c in cells]])
    floors = [f"{1e3 * r['metrics']['ideal_ms_per_step']:.0f}" for r, _ in maps]
    rows.append(["floor (weights + KV once)", *[f"{f} µs" for f in floors]])
    return markdown_table(header, rows)
