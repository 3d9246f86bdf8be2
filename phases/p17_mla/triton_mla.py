"""The absorbed MLA decode in Triton: H query heads over one shared latent "KV head", split-K.

mla.py folds W_UK into the query, so every head's query is W = r + rope values wide and every
head reads the same cached rows [c (r) | k_pe (rope)]: attention with one KV head and H query
heads (MQA), key width W, value width r (the value is the latent c itself). So one program holds
all H heads and reads each cached row once for all of them (p15's kernel did the same for a GQA
group). The split over the context and the exact merge of the splits are p15's (triton_decode.py:
a program per (sequence, split) writes o_s and lse_s; the combine kernel merges them).

Per tile of BLOCK_N cached rows: scores (H, BLOCK_N) = q_lat c^T + q_pe k_pe^T (two dots: r and
rope are powers of two apart, 512 and 64 for DeepSeek-V2), the online softmax, acc (H, r) += p c.

Three variants of the launch, each a keyword of latent_decode whose default is what the engine
runs; the kernel-tune sweep (kernel_bench.py --tune) times them against each other:
  value_split    1 or 2 programs per (sequence, split). With 2, each computes the full W-wide
                 scores but accumulates half the value columns (r / 2): half the (H, r) fp32
                 accumulator (32 KB -> 16 KB a program), so more programs fit an SM (ptxas for
                 sm_90a, 32-row tiles on 4 warps: 201 -> 146 registers a thread, 2 -> 3 programs),
                 for twice the score dots. The pair sits side by side in the grid: the second reads
                 the rows while the first's are still in L2.
  partial_dtype  the split partials o_s: fp32, or bf16 (half the bytes written and read back by
                 the combine: 16 heads x 512 x 4 bytes a split, 8 MB at 256 splits beside 37.7 MB
                 of latents at 32k rows). The LSEs stay fp32.
  head_tile      the query tile's rows, the heads padded up to it: 16 (the least tl.dot takes: the
                 older mma.sync path) or 64 (Hopper's wgmma takes 64 rows: 4x the multiplies for 16
                 heads, on the faster units; 144 KB of shared memory at 32-row tiles, one program an SM).

Shapes: q (B, H, W) with the latent part first; pool (num_pages, page_size, 1, W), one layer's;
block_tables (B, max_pages) int32; context_lens (B,) int32 on the device. Returns (B, H, r).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_decode import (INTERPRETED, PDL_DEFAULT, choose_num_splits, combine_splits, gdc_launch_dependents,
                            launch_options, use_pdl)

# Launch shape from `make phase-17 bench PART=kernel-tune` on an H200
# (kernel-tune-h200.json in its results): tiles of 32 cached rows (32 x 576 bf16 = 36 KB), 4 warps,
# 2 stages (a tile loading while the one before is used; 3 stages ran 1-4% slower), 4 waves of
# programs per SM. Against Triton's defaults (3 stages) and 2 waves: batch 64 / 4k 165 -> 130 us (2
# waves meant 5 splits, 320 programs, 2.4 waves: the last wave ran 40% full), batch 1 and 4 at 32k
# within 6%.
BLOCK_N, NUM_WARPS, NUM_STAGES, WAVES = 32, 4, 2, 4
# One sequence reads fastest in 64-row tiles on 8 warps, in both sweeps (H200: 20.1 against 21.9 us
# at batch 1 / 32k; H100, bf16 partials: 21.1 against 23.6); from batch 4 on the 32-row tiles lead
# (H100, batch 4 / 32k: 67.8 against 79.7 us).
SINGLE_SEQUENCE_LAUNCH = (64, 8, 2)
# The variants (module docstring) as the engine runs them, from the H100 sweep (kernel-tune-h100.json):
# no value split and 16-row head tiles (each lost at every shape: batch 1 / 32k 25.1 and 39.3 us
# against 21.1); partials in the query's 16-bit dtype from BF16_PARTIALS_FROM splits on, fp32 below
# (bf16: batch 1 / 32k 24.4 -> 21.1 us, batch 4 / 32k 69.5 -> 67.8; at batch 64 / 4k, 3-9 splits,
# fp32 was 3-7% faster). An fp32 query (the CPU tests) keeps fp32 partials: exact as before.
VALUE_SPLIT, HEAD_TILE, BF16_PARTIALS_FROM = 1, 16, 32
# One latent "KV head": at batch 1 there is one program per split, so p15's cap of 128 splits (set
# for 8 KV heads) would leave SMs without enough programs. A split's partial is H x r floats
# (32 KB for 16 heads): 256 of them are 8 MB of scratch and a short combine.
MAX_SPLITS = 256


def latent_launch(batch: int) -> tuple[int, int, int]:
    """(block_n, num_warps, num_stages) for a batch: SINGLE_SEQUENCE_LAUNCH at 1, else the default."""
    return SINGLE_SEQUENCE_LAUNCH if batch == 1 else (BLOCK_N, NUM_WARPS, NUM_STAGES)


def choose_latent_splits(batch: int, num_sms: int, max_context_len: int) -> int:
    """p15's rule (triton_decode.choose_num_splits) for VALUE_SPLIT programs a split (one latent
    "KV head"), tiles of latent_launch's rows, WAVES programs an SM, up to MAX_SPLITS: batch 1 over
    32k rows on 132 SMs -> 128 splits of 256 rows (4 tiles of 64) each; batch 64 over 4k -> 9."""
    return choose_num_splits(batch, VALUE_SPLIT, num_sms, max_context_len, block_n=latent_launch(batch)[0],
                             waves=WAVES, max_splits=MAX_SPLITS)


# num_splits is an ordinary argument, not compiled in: one compile a launch shape at any split count
@triton.jit(do_not_specialize=["num_splits"])
def _latent_split_kernel(q_ptr, pool_ptr, table_ptr, lens_ptr, o_ptr, lse_ptr, scale, num_splits,
                         stride_qb, stride_qh, stride_pp, stride_ps, stride_tb,
                         stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                         H: tl.constexpr, R: tl.constexpr, RV: tl.constexpr, P: tl.constexpr, PAGE: tl.constexpr,
                         BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
                         UPCAST: tl.constexpr, WRITE_LSE: tl.constexpr, TILE_IN_PAGE: tl.constexpr,
                         PDL: tl.constexpr):
    """Program (half, b, s): every head of sequence b over split s of its cached rows, accumulating
    the RV value columns [half * RV, (half + 1) * RV): all R of them, or a half (the value split).
    TILE_IN_PAGE (PAGE a multiple of BLOCK_N): a tile never crosses a page (splits start on whole
    tiles), so one page id a tile and BLOCK_N consecutive rows; else a page id a row (a gather).
    PDL: the combine may launch now (triton_decode.use_pdl)."""
    if PDL:
        gdc_launch_dependents()
    half, b, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    length = tl.load(lens_ptr + b)
    chunk = tl.cdiv(tl.cdiv(length, num_splits), BLOCK_N) * BLOCK_N   # rows per split, whole tiles
    lo = split * chunk
    hi = tl.minimum(lo + chunk, length)
    heads = tl.arange(0, BLOCK_H)
    head_ok = heads < H
    vdims = half * RV + tl.arange(0, RV)                      # the value columns this program sums
    pdims = tl.arange(0, BLOCK_P)
    p_ok = pdims < P
    q_row = q_ptr + b * stride_qb + heads[:, None] * stride_qh
    q_v = tl.load(q_row + vdims[None, :], mask=head_ok[:, None], other=0.0)                         # (BLOCK_H, RV)
    q_pe = tl.load(q_row + R + pdims[None, :], mask=head_ok[:, None] & p_ok[None, :], other=0.0)    # (BLOCK_H, BLOCK_P)
    if UPCAST:
        q_v, q_pe = q_v.to(tl.float32), q_pe.to(tl.float32)
    if RV < R:                                # the value split: the partner's half, scored here only
        odims = (1 - half) * RV + tl.arange(0, RV)
        q_o = tl.load(q_row + odims[None, :], mask=head_ok[:, None], other=0.0)                     # (BLOCK_H, RV)
        if UPCAST:
            q_o = q_o.to(tl.float32)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, RV], tl.float32)
    table = table_ptr + b * stride_tb
    for start in range(lo, hi, BLOCK_N):
        rows = start + tl.arange(0, BLOCK_N)
        row_ok = rows < length
        if TILE_IN_PAGE:      # start < length: its page is in the table; rows past length are masked
            page = tl.load(table + start // PAGE).to(tl.int64)
            row = pool_ptr + page * stride_pp + ((start % PAGE + tl.arange(0, BLOCK_N)) * stride_ps)[:, None]
        else:
            page = tl.load(table + rows // PAGE, mask=row_ok, other=0)
            row = pool_ptr + (page.to(tl.int64) * stride_pp + (rows % PAGE) * stride_ps)[:, None]   # (BLOCK_N, 1)
        c = tl.load(row + vdims[None, :], mask=row_ok[:, None], other=0.0)                          # (BLOCK_N, RV)
        k_pe = tl.load(row + R + pdims[None, :], mask=row_ok[:, None] & p_ok[None, :], other=0.0)   # (BLOCK_N, BLOCK_P)
        if UPCAST:
            c, k_pe = c.to(tl.float32), k_pe.to(tl.float32)
        s = tl.dot(q_v, tl.trans(c)) + tl.dot(q_pe, tl.trans(k_pe))                                # (BLOCK_H, BLOCK_N)
        if RV < R:
            c_o = tl.load(row + odims[None, :], mask=row_ok[:, None], other=0.0)                    # (BLOCK_N, RV)
            if UPCAST:
                c_o = c_o.to(tl.float32)
            s += tl.dot(q_o, tl.trans(c_o))
        s = tl.where(row_ok[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c)
        m = m_new
    seen = l > 0                                                  # False only for an empty split
    l_safe = tl.where(seen, l, 1.0)
    o = acc / l_safe[:, None]
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + vdims[None, :],
             o.to(o_ptr.dtype.element_ty), mask=head_ok[:, None])
    # the LSE: one of a value-split pair writes it (their scores agree to fp32 rounding: the pair
    # adds its dots in the other order)
    if WRITE_LSE and half == 0:
        lse = tl.where(seen, m + tl.log(l_safe), float("-inf"))
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=head_ok)


def partials_dtype(dtype: torch.dtype, num_splits: int) -> torch.dtype:
    """The split partials' dtype: a 16-bit query's own from BF16_PARTIALS_FROM splits on (half the
    partial bytes, where they weigh most), else fp32."""
    return dtype if dtype in (torch.bfloat16, torch.float16) and num_splits >= BF16_PARTIALS_FROM else torch.float32


def latent_decode(q: torch.Tensor, pool: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
                  rank: int, scale: float, num_splits: int = 1, pdl: bool = PDL_DEFAULT, **launch) -> torch.Tensor:
    """q (B, H, W) over each sequence's first context_lens[b] cached rows of `pool`; -> (B, H, rank).
    pdl: the combine launched as the split kernel's programmatic dependent (triton_decode.use_pdl,
    default PDL_DEFAULT). launch: latent_splits' keywords (the tune's). No host read of device data,
    grids (value_split, B, S) and (B, H, slices): capturable in a CUDA graph."""
    out, partials, lse = latent_splits(q, pool, block_tables, context_lens, rank, scale, num_splits, pdl=pdl, **launch)
    if num_splits > 1:
        combine_splits(partials, lse, out, num_splits, pdl)
    return out


def latent_splits(q: torch.Tensor, pool: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
                  rank: int, scale: float, num_splits: int = 1, block_n: int | None = None,
                  num_warps: int | None = None, num_stages: int | None = None, value_split: int = VALUE_SPLIT,
                  partial_dtype: torch.dtype | None = None, head_tile: int = HEAD_TILE, pdl: bool = PDL_DEFAULT):
    """The split kernel alone (latent_decode without the combine; the tune times it alone too):
    -> (out (B, H, rank), partials (B, H, S, rank), LSEs (B, H, S)); with one split `out` is the
    answer and the other two are `out` itself. value_split, partial_dtype, head_tile: the variants
    (module docstring)."""
    B, H, W = q.shape
    page = pool.shape[1]
    rope = W - rank
    assert pool.shape[2] == 1 and pool.shape[3] == W and pool.stride(-1) == 1 and q.stride(-1) == 1
    assert rank & (rank - 1) == 0 and rank >= 16, f"kv_lora_rank {rank} must be a power of two >= 16"
    assert value_split in (1, 2) and rank // value_split >= 16
    assert head_tile >= 16 and head_tile & (head_tile - 1) == 0
    tuned_n, tuned_warps, tuned_stages = latent_launch(B)
    block_n, num_warps, num_stages = block_n or tuned_n, num_warps or tuned_warps, num_stages or tuned_stages
    out = torch.empty(B, H, rank, dtype=q.dtype, device=q.device)
    if partial_dtype is None:
        partial_dtype = partials_dtype(q.dtype, num_splits)
    if num_splits == 1:
        o, lse, stride_os = out, out, 0                           # the partial is the answer
    else:
        o = torch.empty(B, H, num_splits, rank, dtype=partial_dtype, device=q.device)
        lse = torch.empty(B, H, num_splits, dtype=torch.float32, device=q.device)
        stride_os = o.stride(2)
    # value_split fastest: a pair's programs start together (one reads a row from HBM, the other from L2)
    _latent_split_kernel[(value_split, B, num_splits)](
        q, pool, block_tables, context_lens, o, lse, scale, num_splits,
        q.stride(0), q.stride(1), pool.stride(0), pool.stride(1), block_tables.stride(0),
        o.stride(0), o.stride(1), stride_os, lse.stride(0), lse.stride(1),
        H=H, R=rank, RV=rank // value_split, P=rope, PAGE=page, BLOCK_H=max(head_tile, triton.next_power_of_2(H)),
        BLOCK_P=max(16, triton.next_power_of_2(rope)), BLOCK_N=block_n, UPCAST=INTERPRETED,
        WRITE_LSE=num_splits > 1, TILE_IN_PAGE=page % block_n == 0,
        PDL=pdl and num_splits > 1 and use_pdl(q.device), **launch_options(num_warps, num_stages))
    return out, o, lse
