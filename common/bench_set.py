"""A phase's standard benchmark set, in named parts: `make phase-NN bench [PART=name]`.

Each phase's bench.py lists its parts: a part is a list of common.bench runs (one comparison
each: engines of one run measured interleaved) or a function for a phase's own measurement.
On a GPU every part is sized to finish inside one 10-minute call; on a CPU the same comparisons
run at --scale small on small presets, so the command always works and always writes a file.
Every record names the make command and part that made it: committed results come from here only.
Every comparison carries its A/A control (aa(): the baseline built twice), so that its ratios are
judged against the drift of identical code in the same run (common.stats).
"""
from __future__ import annotations

import argparse
from typing import Callable, Union

import torch

from . import bench

Part = Union[list[list[str]], Callable[[list[str], str], None]]


def aa(engines: str, base: str | None = None) -> str:
    """An engine list with the A/A control: the baseline (`base`, default the first engine) and
    its twin first, then the rest. "p05,p06,hf-static" -> "p05,p05#2,p06,hf-static". The
    harness builds the twin like the baseline and measures it like the rest (common.bench)."""
    specs = engines.split(",")
    base = base or specs[0]
    if base not in specs:
        raise ValueError(f"A/A baseline {base!r} is not among the engines {engines!r}")
    return ",".join([base, bench.twin_spec(base), *[s for s in specs if s != base]])


def make_command(phase: str, part: str) -> str:
    return f"make phase-{phase[1:3]} bench PART={part}"


def run_parts(phase: str, gpu_parts: dict[str, Part], cpu_parts: dict[str, Part], argv: list[str]) -> None:
    """Run the named part (--part), or every part in order; extra arguments go to each run."""
    p = argparse.ArgumentParser(prog=f"make phase-{phase[1:3]} bench", add_help=False)
    p.add_argument("--part", default=None)
    p.add_argument("--device", default=None)
    args, rest = p.parse_known_args(argv)
    on_gpu = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    parts = gpu_parts if on_gpu else cpu_parts
    if args.part is not None and args.part not in parts:
        raise SystemExit(f"no part {args.part!r} in {phase}'s {'GPU' if on_gpu else 'CPU'} bench set; "
                         f"parts: {', '.join(parts)}")
    rest += ["--device", args.device] if args.device else []
    for name in [args.part] if args.part else list(parts):
        run_part(phase, name, parts[name], rest)


def run_part(phase: str, name: str, part: Part, rest: list[str]) -> None:
    command = make_command(phase, name)
    print(f"[bench] {command}", flush=True)
    if callable(part):
        part(rest, command)
        return
    for run in part:
        bench.main(["--phase", phase, *run, *rest], part=name, make_command=command)

