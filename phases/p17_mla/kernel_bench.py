"""`make phase-NN kernel`: check the latent (MLA) decode kernel, then time it.

1. Check: triton_mla.latent_decode against mla.latent_decode_reference in float64, on scattered
   page tables, contexts that end mid-page, 4 heads (padded to 16) and 16, rotary parts of 8
   (padded) and 64, at 1, 2, 3 and 8 splits (more splits than tiles included), at the engine's
   launch and the variants the tune times (CHECK_VARIANTS); tolerance 1e-4 in the interpreter
   (fp32), 2e-2 on a GPU (bf16) and wherever the partials are bf16.
2. Time (GPU only): DeepSeek-V2-Lite's shape (16 heads, latent 512, rotary key 64, pages of 64:
   the engine's for MLA on a GPU), batch 1 to 64 x contexts 1k to 32k: the split count the kernel
   chooses ("triton"), the same with the combine launched as the split kernel's programmatic
   dependent ("triton PDL"; the engine's default is not to), one split ("triton 1 split"), and at
   batch 1 and 4 the counts around the chosen one ("triton S=n": the data the split rule answers
   to), each call replayed in a CUDA graph, as GB/s of cached rows read (576 bf16 values a token)
   against the copy bandwidth measured in the same run.
3. Tune (--tune, GPU only; the bench's "kernel-tune" part): every launch shape (TUNE_LAUNCH) x
   page size (TUNE_PAGES) x PDL on and off at the split counts of 1-4 programs an SM on
   TUNE_SHAPES, each call checked against the reference and timed whole and with its split kernel
   alone, written to kernel-tune-<device>.json: the data triton_mla's launch constants are read from.
Writes results/<phase>/kernel-<device>.json. On CPU the kernel runs in Triton's interpreter.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
from types import SimpleNamespace

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")       # before triton is first imported

from common import roofline                               # noqa: E402
from common.device import device_name                     # noqa: E402
from common.results import RESULTS, device_tag, provenance, write_records   # noqa: E402

from .mla import latent_decode_reference                  # noqa: E402
from .triton_decode import choose_num_splits              # noqa: E402
from .triton_mla import (HEAD_TILE, VALUE_SPLIT, choose_latent_splits, latent_decode, latent_launch,   # noqa: E402
                         latent_splits, partials_dtype)

PHASE = __package__.split(".")[-1]
# (batch, heads, latent, rotary, page, context lengths): awkward on purpose
# (pages of 64 at batch 2: tiles of 32 inside a page, the one-page-id-a-tile path)
CHECKS = [(3, 4, 32, 8, 4, [15, 1, 9]), (2, 16, 64, 16, 5, [33, 70]), (4, 16, 512, 64, 16, [1, 17, 100, 255]),
          (2, 16, 512, 64, 64, [65, 200])]
CHECK_SPLITS = (1, 2, 3, 8)
# triton_mla's variants checked beside its defaults ({}): each of the value split and bf16 partials
# alone, and the 64-row head tile with both
CHECK_VARIANTS = ({}, {"value_split": 2}, {"partial_dtype": torch.bfloat16},
                  {"value_split": 2, "head_tile": 64, "partial_dtype": torch.bfloat16})
CONTEXTS, BATCHES = (1024, 4096, 16384, 32768), (1, 4, 16, 64)
SWEEP_SPLITS = (16, 32, 64, 128, 256)     # at batch 1 and 4: the split counts around the chosen one
HEADS, RANK, ROPE, PAGE = 16, 512, 64, 64     # PAGE: the engine's for MLA on a GPU


def random_case(B, heads, rank, rope, page, lens, device, dtype):
    """q (B, H, W), a pool with scattered page tables, lengths, and the reference's step view."""
    pages = sum(-(-n // page) for n in lens) + 7
    pool = torch.randn(pages, page, 1, rank + rope, device=device).to(dtype)
    order, tables, at = torch.randperm(pages).tolist(), [], 0
    for n in lens:
        tables.append(order[at:at + -(-n // page)])
        at += len(tables[-1])
    width = max(len(t) for t in tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=device)
    q = torch.randn(B, heads, rank + rope, device=device).to(dtype)
    return q, pool, table, lens_t, SimpleNamespace(block_tables=table, context_lens=lens_t, max_context_len=max(lens))


def variant(value_split: int = VALUE_SPLIT, head_tile: int = HEAD_TILE,
            partial_dtype: torch.dtype = torch.float32) -> dict:
    """A variant's settings as a record stores them (the defaults filled in)."""
    return {"value_split": value_split, "head_tile": head_tile,
            "partial_dtype": str(partial_dtype).removeprefix("torch.")}


def check(device: str, dtype: torch.dtype) -> list[dict]:
    results = []
    for B, heads, rank, rope, page, lens in CHECKS:
        q, pool, table, lens_t, step = random_case(B, heads, rank, rope, page, lens, device, dtype)
        scale = (rank + rope) ** -0.5
        ref = latent_decode_reference(q.double(), pool.double(), rank, scale, step)
        for options, splits in itertools.product(CHECK_VARIANTS, CHECK_SPLITS):
            options = {"partial_dtype": partials_dtype(dtype, splits), **options}   # the rule's, unless named
            got = latent_decode(q, pool, table, lens_t, rank, scale, splits, **options)
            err = (got.double() - ref).abs().max().item()
            setting = variant(**options)
            tolerance = 1e-4 if dtype == torch.float32 and setting["partial_dtype"] == "float32" else 2e-2
            results.append({"setting": {"batch": B, "heads": heads, "rank": rank, "rope": rope, "page": page,
                                        "lens": lens, "num_splits": splits, **setting},
                            "metrics": {"max_abs_err": err}, "ok": err < tolerance})
            print(f"[kernel] check B={B} H={heads} r={rank} rope={rope} page={page} S={splits} "
                  f"{describe(setting)}: max error {err:.2e} {'ok' if err < tolerance else 'FAILED'}", flush=True)
    return results


def describe(setting: dict) -> str:
    """A launch and variant in a line: 'n=32 w=4 st=2 v=2 h=16 bf16 S=64' (what the setting has)."""
    names = (("block_n", "n="), ("num_warps", "w="), ("num_stages", "st="), ("value_split", "v="),
             ("head_tile", "h="), ("partial_dtype", ""), ("pdl", "pdl="), ("num_splits", "S="))
    return " ".join(f"{short}{setting[key]}".replace("bfloat16", "bf16").replace("float32", "fp32")
                    for key, short in names if key in setting)


def time_grid(device: str, copy_bytes_per_s: float) -> list[dict]:
    import triton.testing
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    results = []
    for context, B in ((c, b) for c in CONTEXTS for b in BATCHES):
        q, pool, table, lens, _ = random_case(B, HEADS, RANK, ROPE, PAGE, [context] * B, device, torch.bfloat16)
        chosen = choose_latent_splits(B, sms, context)
        row_bytes = B * context * (RANK + ROPE) * 2                   # each cached row read once
        sweep = [(f"triton S={s}", s) for s in SWEEP_SPLITS if B <= 4 and s != chosen]
        dependent = [("triton PDL", chosen)] if chosen > 1 else []    # the combine as a programmatic dependent
        for name, splits in (("triton", chosen), ("triton 1 split", 1), *dependent, *sweep):
            pdl = name == "triton PDL"
            us = 1e3 * triton.testing.do_bench_cudagraph(
                lambda: latent_decode(q, pool, table, lens, RANK, 192 ** -0.5, splits, pdl=pdl), rep=50,
                return_mode="median")
            gb_s = row_bytes / (us * 1e-6) / 1e9
            results.append({"engine": name, "preset": "mla-lite", "timer": "cudagraph",
                            "setting": {"batch": B, "context": context, "page": PAGE, "heads": HEADS,
                                        "num_splits": splits, "block_n": latent_launch(B)[0], "partial_dtype":
                                        str(partials_dtype(torch.bfloat16, splits)).removeprefix("torch.")},
                            "metrics": {"us": us, "kv_gb_s": gb_s, "copy_frac": gb_s * 1e9 / copy_bytes_per_s}})
            print(f"[kernel] {name:<14} B={B:<3} context={context:<6} S={splits:<3} {us:9.1f} us {gb_s:7.0f} GB/s "
                  f"({100 * results[-1]['metrics']['copy_frac']:.0f}% of copy)", flush=True)
        del q, pool
        torch.cuda.empty_cache()
    return results


# The sweep the launch constants come from (`make phase-NN bench PART=kernel-tune`): batch 1 at 32k
# rows (the goal's shape), batch 4 at 32k and batch 64 at 4k, every launch shape x page size at the
# split counts of 1, 2 and 4 waves of programs, the partials in the rule's dtype (partials_dtype).
# The variants (value split, 64-row head tile, fp32 against bf16 partials) were swept in the first
# two sweeps (history/kernel-tune-*.json) and lost; this one asks where one sequence's time goes.
TUNE_SHAPES = ((1, 32768), (4, 32768), (64, 4096))
# (block_n, num_warps, num_stages): the first sweeps' winners (32 rows on 4 warps, 64 on 8, both 2
# stages) and deeper pipelines of smaller tiles: bytes in flight a program (a 64-row tile is 72 KB;
# one program per SM at batch 1 read 17 GB/s, 132 of them 2.2 TB/s at most). 64 rows x 3 stages
# would need 216 KB of shared memory: a launch that does not compile is reported and skipped.
# The sweep at git 28de14f (H100, before PDL; in history/ once a later sweep replaces it) timed
# eight: at batch 1, 16-row tiles on 3-4 stages ran 23-57% behind each page size's best and 32 rows
# on 8 warps 20-63%; the four below were within 5% of each shape's best.
TUNE_LAUNCH = [(32, 4, 2), (32, 4, 3), (64, 8, 2), (64, 8, 3)]
TUNE_WAVES = (1, 2, 4)      # 8 never won (batch 4 / 32k: 256 splits 80 us, 64 splits 65 us)
# Pages of 16 (every other model's) and 64 (MLA's on a GPU, FlashMLA's): at 64 every tile lies in
# one page (TILE_IN_PAGE: one page id a tile, consecutive rows) where at 16 a 32- or 64-row tile
# gathers a page id a row.
TUNE_PAGES = (16, 64)
# The combine as the split kernel's programmatic dependent (triton_decode.use_pdl), and not.
TUNE_PDL = (True, False)
# about 2 minutes on an H100 (estimated): 4 launches x 2 pages x 2 x 3 shapes x <= 3 split counts,
# each timed twice (the split kernel alone, then with the combine)
TUNE_TOLERANCE = 2e-2       # check()'s, in bf16


def tune_settings(B: int, context: int, page: int, sms: int):
    """(setting, latent_decode's keywords) for every launch x split count x PDL at one page size.
    The split counts aim for 1, 2 and 4 programs an SM; one split has no combine, so it is timed
    once (under pdl=True, where PDL does nothing)."""
    for (block_n, warps, stages), pdl in itertools.product(TUNE_LAUNCH, TUNE_PDL):
        splits = sorted({choose_num_splits(B, 1, sms, context, block_n=block_n, waves=w, max_splits=1024)
                         for w in TUNE_WAVES})
        for S in (S for S in splits if S > 1 or pdl):
            options = {"num_splits": S, "block_n": block_n, "num_warps": warps, "num_stages": stages, "pdl": pdl}
            setting = {"batch": B, "context": context, "page": page, "heads": HEADS, "block_n": block_n,
                       "num_warps": warps, "num_stages": stages, "pdl": pdl,
                       **variant(partial_dtype=partials_dtype(torch.bfloat16, S)), "num_splits": S}
            yield setting, options


def tune(device: str, copy_bytes_per_s: float, save) -> list[dict]:
    """Every launch x page x split count on TUNE_SHAPES, each checked against the reference and
    timed twice: the whole call ("us") and its split kernel alone ("split_us": the rest is the
    combine and the launch gap between the two kernels)."""
    import triton.testing
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    scale = 192 ** -0.5
    results = []
    for (B, context), page in itertools.product(TUNE_SHAPES, TUNE_PAGES):
        q, pool, table, lens, step = random_case(B, HEADS, RANK, ROPE, page, [context] * B, device, torch.bfloat16)
        ref = latent_decode_reference(q.float(), pool.float(), RANK, scale, step)
        row_bytes = B * context * (RANK + ROPE) * 2
        for setting, options in tune_settings(B, context, page, sms):
            def call():
                return latent_decode(q, pool, table, lens, RANK, scale, **options)

            def splits_alone():
                return latent_splits(q, pool, table, lens, RANK, scale, **options)
            try:
                err = (call().float() - ref).abs().max().item()
                us = 1e3 * triton.testing.do_bench_cudagraph(call, rep=20, return_mode="median")
                split_us = 1e3 * triton.testing.do_bench_cudagraph(splits_alone, rep=20, return_mode="median")
            except Exception as e:               # a configuration that does not compile (shared memory)
                print(f"[tune] B={B} ctx={context} page={page} {describe(setting)}: {type(e).__name__}", flush=True)
                continue
            frac = row_bytes / (us * 1e-6) / copy_bytes_per_s
            ok = err < TUNE_TOLERANCE
            results.append({"engine": "triton", "preset": "mla-lite", "timer": "cudagraph", "setting": setting,
                            "metrics": {"us": us, "split_us": split_us, "copy_frac": frac,
                                        "split_copy_frac": row_bytes / (split_us * 1e-6) / copy_bytes_per_s,
                                        "max_abs_err": err}, "ok": ok})
            print(f"[tune] B={B} ctx={context} page={page} {describe(setting)}: {us:8.1f} us {100 * frac:5.1f}% "
                  f"(split kernel {split_us:.1f} us){'' if ok else f' WRONG (max error {err:.2e})'}", flush=True)
        del q, pool, ref
        torch.cuda.empty_cache()
        save(results)                            # after each shape: a sweep cut short keeps what it timed
    print_best(results)
    return results


def print_best(results: list[dict], top: int = 6) -> None:
    """Per shape and page: the `top` fastest correct calls."""
    def line(r: dict) -> str:
        m = r["metrics"]
        return f"   {describe(r['setting']):<28} {m['us']:8.1f} us {100 * m['copy_frac']:5.1f}% (split {m['split_us']:.1f})"
    for (B, context), page in itertools.product(TUNE_SHAPES, TUNE_PAGES):
        rows = sorted((r for r in results if r["ok"] and (r["setting"]["batch"], r["setting"]["context"],
                       r["setting"]["page"]) == (B, context, page)), key=lambda r: r["metrics"]["us"])
        print(f"== batch {B} context {context} page {page}", *map(line, rows[:top]), sep="\n")


def main(argv: list[str] | None = None, make_command: str | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check-only", action="store_true", help="skip the timings")
    p.add_argument("--tune", action="store_true", help="time the launch configurations instead (GPU)")
    args, _ = p.parse_known_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    checks = check(device, dtype)
    if not all(c["ok"] for c in checks):
        raise SystemExit("[kernel] the kernel disagrees with the reference: no timings taken")
    name = device_name(device)
    prov = provenance(name) | {"make_command": make_command or f"make phase-{PHASE[1:3]} kernel"}
    base = {"phase": PHASE, "preset": "mla-lite", "dtype": str(dtype).removeprefix("torch."), "scale": "full",
            "device": name, "provenance": prov}
    records = [base | {"engine": "triton", "workload": "kernel-check", **c} for c in checks]
    out = RESULTS / PHASE / f"kernel-{device_tag(name)}.json"
    if device == "cuda" and args.tune:
        hw = roofline.measure(device)
        path = RESULTS / PHASE / f"kernel-tune-{device_tag(name)}.json"
        tune(device, hw["copy_bytes_per_s"],
             lambda rows: write_records(path, [base | {"workload": "kernel-tune", "hardware": hw, **r} for r in rows],
                                          sweep=True))
        return
    if device == "cuda" and not args.check_only:
        hw = roofline.measure(device)
        records += [base | {"workload": "kernel", "hardware": hw, **r} for r in time_grid(device, hw["copy_bytes_per_s"])]
    write_records(out, records, sweep=True)


if __name__ == "__main__":
    main(sys.argv[1:])
