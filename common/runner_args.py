"""The command line every workload runner of phase engines shares (common.long_mix,
common.shared_prefix): which phase's results, presets, engines, scale, repeats, device, dtype."""
from __future__ import annotations

import argparse

from .device import check_device, default_device, default_dtype


def parser(doc: str, phase: str, engines: str, out: str) -> argparse.ArgumentParser:
    """The shared options; `phase`, `engines` and `out` are the examples and the default file
    its help names. A runner adds its own options, then calls finish()."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase", required=True, help=f"results folder, e.g. {phase}")
    p.add_argument("--presets", default="llama-1b", help="comma-separated presets")
    p.add_argument("--engines", required=True, help=f"comma-separated phase engines with their options: \"{engines}\"")
    p.add_argument("--scale", choices=["full", "small"], default="full")
    p.add_argument("--repeats", type=int, default=None, help="rounds of every engine (default 3)")
    p.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--out", default=None, help=f"result file (default results/<phase>/{out}-<device>.json)")
    return p


def finish(p: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """Parse; the device and dtype resolved, presets and engines as lists, repeats checked."""
    args = p.parse_args(argv)
    args.device = check_device(args.device or default_device())
    args.dtype = args.dtype or default_dtype(args.device)
    args.presets, args.engines = args.presets.split(","), args.engines.split(",")
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be positive, got {args.repeats}")
    return args
