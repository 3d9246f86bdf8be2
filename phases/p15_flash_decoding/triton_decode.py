"""Split-K ("flash decoding") paged decode attention in Triton: one sequence's keys over many programs.

The one-program-per-(sequence, KV head) kernel (the previous phase's) launches B * KV programs.
At batch 1 on llama-8b that is 8 programs on a 132-SM GPU: 124 SMs idle while 8 walk a long
context alone, and HBM bandwidth, the only thing decode attention needs, goes mostly unused.
Split-K cuts each sequence's context into S contiguous ranges and gives each its own program
(vLLM's PagedAttention v2 does the same with fixed 512-token partitions; FlashInfer's decode with
split-KV and a merge of "attention states"). Two kernels:

  1. split:   programs over (b, kv, s). Program (b, kv, s) runs the usual online softmax for all
              G = H / KV query heads of KV head kv (GQA: its K/V tile is read once, for G rows)
              over keys [s * chunk, min((s + 1) * chunk, len_b)), and writes, per query row,
              its partial output o_s = acc / l (fp32) and its log-sum-exp lse_s = m + log l
              (fp32; -inf when the range is empty) to scratch (B, H, S, D) and (B, H, S).
  2. combine: programs over (b, h). With w_s = exp(lse_s - max_s lse_s),
              out = sum_s w_s * o_s / sum_s w_s. Since exp(lse_s) = exp(m_s) * l_s, this is the
              softmax over the whole context, exactly (the same rescaling online softmax does
              between tiles, done once between splits). An empty split has w_s = 0.

The split boundaries are computed on the device from len_b: chunk = ceil(ceil(len_b / S) / BLOCK_N)
* BLOCK_N keys (= ceil(len_b / (S * BLOCK_N)) tiles), so every split but the last busy one holds
whole tiles, and a short sequence leaves its trailing splits empty: those programs read their
length and exit. The grid, (B, KV, S) then (B, H), depends on shapes and S only, never on a
length, so both launches capture in a CUDA graph and replay for any lengths <= the block table.
S is a host int, frozen at capture: choose it for the longest context a graph may serve.

With S = 1 there is nothing to combine: the split kernel writes the normalized output straight
into `out` (q's dtype) and the combine is not launched: S = 1 is the previous phase's kernel.

Shapes: q (B, H, D); k_pages, v_pages (num_pages, page_size, KV, D) views of the KV pool;
block_tables (B, max_pages) int32; context_lens (B,) int32 on the device; returns (B, H, D) in
q's dtype. A speculative verify's lanes are rows like any other (each its own length).
"""
from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

# Under TRITON_INTERPRET=1 (CPU) the interpreter computes bf16 wrongly: loads are cast to fp32.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
try:                       # programmatic dependent launch (use_pdl): a Triton that has it
    from triton.backends.nvidia.compiler import CUDAOptions
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    PDL_IN_TRITON = "launch_pdl" in CUDAOptions.__dataclass_fields__
except ImportError:
    PDL_IN_TRITON = False

    @triton.jit
    def gdc_launch_dependents():                              # never called: PDL is False then
        pass

    @triton.jit
    def gdc_wait():
        pass

MAX_SPLITS = 128           # more partials than this cost more to combine than they gain
MIN_TILES_PER_SPLIT = 4    # a split shorter than this is mostly prologue (q load) and epilogue (stores)
SPLIT_BLOCK_N = 64         # keys per tile when splitting (the split rule counts tiles of this size)
IN_FLIGHT_BYTES = 128 << 10  # K/V tile bytes the split count aims to keep loading on each SM

# (block_n, num_warps, num_stages) by head dim and regime, from `make phase-15 bench PART=kernel-tune`
# on an H200 (kernel-tune-h200.json in its results). Splitting (S > 1) at head dim 64:
# two warps per program, so more programs fit an SM; one split (a full batch) at head dim 64: tiles
# of 128 keys, each program's loads as long as llama-8b's. Triton's defaults (4 warps, 3 stages)
# were within 1% of the best at head dim 128.
LAUNCH = {(64, True): (64, 2, 3), (64, False): (128, 4, 3)}
LAUNCH_DEFAULT = (64, 4, 3)


def launch_config(head_dim: int, num_splits: int) -> tuple[int, int, int]:
    """(block_n, num_warps, num_stages) for a head dim at a split count."""
    return LAUNCH.get((head_dim, num_splits > 1), LAUNCH_DEFAULT)


def target_waves(head_dim: int, block_n: int = SPLIT_BLOCK_N) -> int:
    """Programs per SM the split count aims for: enough that IN_FLIGHT_BYTES of K/V tiles load at
    once (memory latency x bandwidth: an SM's share of HBM needs ~100 KB in flight). One program
    loads a K and a V tile of block_n x head_dim bf16: 16 KB at head dim 64 (-> 8 programs an SM),
    32 KB at 128 (-> 4). The kernel-tune sweep: llama-1b at batch 1 / 32k ran 48% of copy at 2
    waves, 65% at 4, 75% at 8; llama-8b 74% at 2, 86% at 4, 79% at 8."""
    return max(1, IN_FLIGHT_BYTES // (2 * block_n * head_dim * 2))


@triton.jit
def _attend_tile(q, m, l, acc, start, length, k_ptr, v_ptr, table_ptr, kv, scale,
                 stride_kp, stride_ks, stride_kh, D: tl.constexpr, PAGE: tl.constexpr,
                 BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    """One tile of keys [start, start + BLOCK_N) folded into the online softmax state.

    q (BLOCK_G, D); m, l (BLOCK_G,) running max and sum of exp(score - m); acc (BLOCK_G, D).
    Key j lives in slot table[j // PAGE] * PAGE + j % PAGE (table_ptr: this sequence's row).
    A tile never crosses its split's end (splits hold whole tiles), only the sequence's end.
    """
    keys = start + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, D)
    key_ok = keys < length
    page = tl.load(table_ptr + keys // PAGE, mask=key_ok, other=0)
    slot = page.to(tl.int64) * stride_kp + (keys % PAGE) * stride_ks + kv * stride_kh      # (BLOCK_N,)
    k = tl.load(k_ptr + slot[:, None] + dims[None, :], mask=key_ok[:, None], other=0.0)  # (BLOCK_N, D)
    v = tl.load(v_ptr + slot[:, None] + dims[None, :], mask=key_ok[:, None], other=0.0)
    if UPCAST:
        k, v = k.to(tl.float32), v.to(tl.float32)
    s = tl.dot(q, tl.trans(k)) * scale                       # (BLOCK_G, BLOCK_N), fp32 accumulate
    s = tl.where(key_ok[None, :], s, float("-inf"))          # every tile has >= 1 real key: m stays finite
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp(m - m_new)                                # rescale what came before (0 on the first tile)
    p = tl.exp(s - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l, acc


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, o_ptr, lse_ptr, scale,
                  stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_tb,
                  stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                  G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, S: tl.constexpr,
                  BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
                  WRITE_LSE: tl.constexpr, out_ptr, count_ptr, stride_outb, stride_outh,
                  FUSE: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr):
    """Program (b, kv, s): the G query heads of KV head kv over split s of sequence b's keys.

    Writes o[b, kv*G + g, s, :] = acc / l (o_ptr's dtype: fp32 scratch, or q's dtype when S == 1
    and o is the output itself) and, if WRITE_LSE, lse[b, kv*G + g, s] = m + log l.
    FUSE: the combine without a second kernel. Each program counts itself done on count[b, kv]
    (an atomic add, after its stores); the one that brings the count to S is the group's last, so
    every partial of the group is written: it merges the G rows into out and resets the count to
    0 for the next call (or graph replay). PDL: the combine kernel may launch now (use_pdl).
    """
    if PDL:
        gdc_launch_dependents()
    b, kv, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    length = tl.load(lens_ptr + b)
    chunk = tl.cdiv(tl.cdiv(length, S), BLOCK_N) * BLOCK_N  # keys per split, whole tiles
    lo = split * chunk
    hi = tl.minimum(lo + chunk, length)                       # lo >= hi: an empty split, no iteration
    rows = tl.arange(0, BLOCK_G)                              # query heads of the group, padded
    dims = tl.arange(0, D)
    row_ok = rows < G
    heads = kv * G + rows
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None], other=0.0)              # (BLOCK_G, D)
    if UPCAST:
        q = q.to(tl.float32)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        m, l, acc = _attend_tile(q, m, l, acc, start, length, k_ptr, v_ptr, table_ptr + b * stride_tb, kv, scale,
                                 stride_kp, stride_ks, stride_kh, D, PAGE, BLOCK_N, UPCAST)
    seen = l > 0                                              # False only for an empty split
    l_safe = tl.where(seen, l, 1.0)
    o = acc / l_safe[:, None]                                 # empty: 0, never 0 / 0
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + dims[None, :],
             o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    if WRITE_LSE:
        lse = tl.where(seen, m + tl.log(l_safe), float("-inf"))
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=row_ok)
    if FUSE:
        tl.debug_barrier()                                    # all of this program's stores issued
        count = count_ptr + b * tl.num_programs(1) + kv
        if tl.atomic_add(count, 1, sem="acq_rel") == S - 1:   # release ours, acquire the others'
            tl.store(count, 0)
            for g in range(G):
                _merge_row(o_ptr + b * stride_ob + (kv * G + g) * stride_oh, lse_ptr + b * stride_lb
                           + (kv * G + g) * stride_lh, out_ptr + b * stride_outb + (kv * G + g) * stride_outh,
                           stride_os, tl.arange(0, D), S, BLOCK_S, ".cg")


@triton.jit
def _merge_row(o_ptr, lse_ptr, out_ptr, stride_os, dims, S: tl.constexpr, BLOCK_S: tl.constexpr,
               CACHE: tl.constexpr):
    """One row: out[dims] = sum_s w_s o[s, dims] / sum_s w_s, w_s = exp(lse_s - max lse).

    o_ptr, lse_ptr, out_ptr point at the row's partials (S, D), LSEs (S,) and output (D,).
    An empty split (lse -inf) weighs 0 and its partial, scratch that may never have been written
    (any bits, NaN included), is replaced by 0 before it is weighed. Both loads issue at once: the
    partials' addresses do not wait on the LSEs (one trip to memory, not two). A row with no keys
    at all (length 0) gets zeros. CACHE: the loads' cache modifier (".cg", L2 only, where other
    programs of the same kernel wrote the partials).
    """
    splits = tl.arange(0, BLOCK_S)
    lse = tl.load(lse_ptr + splits, mask=splits < S, other=float("-inf"), cache_modifier=CACHE)
    o = tl.load(o_ptr + splits[:, None] * stride_os + dims[None, :], mask=(splits < S)[:, None], other=0.0,
                cache_modifier=CACHE)                         # (BLOCK_S, D)
    full = lse > float("-inf")                                # (BLOCK_S,) splits that saw keys
    o = tl.where(full[:, None], o.to(tl.float32), 0.0)
    top = tl.max(lse, axis=0)
    top = tl.where(top > float("-inf"), top, 0.0)             # finite, so exp(-inf - top) = 0: empty weighs 0
    w = tl.exp(lse - top)                                     # the largest split weighs 1
    total = tl.sum(w, axis=0)                                 # >= 1, or 0 when no split saw keys
    out = tl.sum(w[:, None] * o, axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + dims, out.to(out_ptr.dtype.element_ty))


@triton.jit
def _combine_kernel(o_ptr, lse_ptr, out_ptr, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                    stride_outb, stride_outh, S: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr,
                    PDL: tl.constexpr):
    """Program (b, h): row h of sequence b merged (_merge_row)."""
    if PDL:
        gdc_wait()                                            # the split kernel's partials are written
    b, h = tl.program_id(0), tl.program_id(1)
    _merge_row(o_ptr + b * stride_ob + h * stride_oh, lse_ptr + b * stride_lb + h * stride_lh,
               out_ptr + b * stride_outb + h * stride_outh, stride_os, tl.arange(0, D), S, BLOCK_S, "")


def launch_options(num_warps: int, num_stages: int) -> dict:
    """Triton's launch options; the interpreter runs a program as plain Python and takes none."""
    return {} if INTERPRETED else {"num_warps": num_warps, "num_stages": num_stages}


# The combine as a programmatic dependent (use_pdl) by default: not yet. Compiled for sm_90 on a
# CPU (tests/test_hopper_compile.py), never run; the kernel benches time it ("triton PDL" rows, the
# p17 tune's pdl=True) against the plain launch before the engine takes it.
PDL_DEFAULT = False


@functools.cache
def use_pdl(device: torch.device) -> bool:
    """Programmatic dependent launch for the combine: Hopper on (griddepcontrol), compiled kernels
    only, where this Triton has it. The split kernel lets its dependents launch as soon as each
    of its programs has started; the combine's programs then take free SM slots during the split
    kernel's tail and wait there (gdc_wait) for its writes: the launch gap between the two kernels
    of a graph is hidden. A CUDA graph captures the dependency as a programmatic edge."""
    return (not INTERPRETED and PDL_IN_TRITON and device.type == "cuda"
            and torch.cuda.get_device_capability(device)[0] >= 9)


def alloc_scratch(batch: int, heads: int, num_splits: int, head_dim: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial outputs (B, H, S, D), LSEs (B, H, S)), fp32. Allocate once for the largest batch and
    split count a graph will use: any leading (B, H, S) corner of them serves a smaller call."""
    partial = torch.empty(batch, heads, num_splits, head_dim, dtype=torch.float32, device=device)
    lse = torch.empty(batch, heads, num_splits, dtype=torch.float32, device=device)
    return partial, lse


def alloc_counters(batch: int, kv_heads: int, device) -> torch.Tensor:
    """The fused combine's done-counts (B, KV), int32, zeroed once: each call's last program of a
    group puts its count back to 0, so the buffer is zero between calls and graph replays. One
    stream at a time: two calls in flight at once on the same counters would count each other."""
    return torch.zeros(batch, kv_heads, dtype=torch.int32, device=device)


def combine_splits(partial: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, num_splits: int,
                   pdl: bool = PDL_DEFAULT) -> torch.Tensor:
    """Merge the first num_splits partials of each (b, h) into out (B, H, D): one program per row.
    pdl: launched as the split kernel's programmatic dependent where use_pdl allows."""
    B, H, D = out.shape
    assert partial.stride(-1) == 1 and lse.stride(-1) == 1 and out.stride(-1) == 1
    pdl = pdl and use_pdl(out.device)
    _combine_kernel[(B, H)](partial, lse, out, partial.stride(0), partial.stride(1), partial.stride(2),
                            lse.stride(0), lse.stride(1), out.stride(0), out.stride(1),
                            S=num_splits, D=D, BLOCK_S=triton.next_power_of_2(num_splits), PDL=pdl,
                            **({"launch_pdl": True} if pdl else {}))
    return out


def paged_decode(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_tables: torch.Tensor,
                   context_lens: torch.Tensor, num_splits: int = 1, block_n: int | None = None,
                   out: torch.Tensor | None = None, scratch: tuple[torch.Tensor, torch.Tensor] | None = None,
                   num_warps: int | None = None, num_stages: int | None = None,
                   counters: torch.Tensor | None = None, pdl: bool = PDL_DEFAULT) -> torch.Tensor:
    """Decode attention of q (B, H, D) over each sequence's first context_lens[b] keys, split S ways.

    No host reads of device data, and grids of (B, KV, S) and (B, H): capturable in a CUDA graph.
    `out` (B, H, D) may be given; `scratch` (from alloc_scratch, at least (B, H, S, D) and (B, H, S))
    should be under a graph, so that every replay writes the same memory (unused with S = 1).
    block_n, num_warps, num_stages: launch_config's unless given (the tune sweep gives them).
    counters (alloc_counters, at least (B, KV)): given, the split kernel's last program of each
    (b, kv) merges the splits itself and no combine kernel is launched (FUSE in _split_kernel).
    The engine does not: the kernel-tune sweep measured it slower at every split shape (a few
    programs merging after all the others beat one launch saved inside a graph).
    pdl: the combine launched as the split kernel's programmatic dependent (use_pdl; default PDL_DEFAULT).
    """
    B, H, D = q.shape
    _, page, KV, _ = k_pages.shape
    G = H // KV
    tuned_n, tuned_warps, tuned_stages = launch_config(D, num_splits)
    block_n, num_warps, num_stages = block_n or tuned_n, num_warps or tuned_warps, num_stages or tuned_stages
    assert H % KV == 0 and num_splits >= 1 and block_n >= 16 and block_n & (block_n - 1) == 0
    assert k_pages.stride() == v_pages.stride() and k_pages.stride(-1) == 1 and q.stride(-1) == 1
    assert D & (D - 1) == 0, f"head_dim {D} must be a power of two"
    out = torch.empty_like(q) if out is None else out
    assert out.shape == q.shape and out.stride(-1) == 1
    fuse = counters is not None and num_splits > 1
    if num_splits == 1:                                       # the partial is the answer: write it
        o, lse, stride_os = out, out, 0                       # (lse unused: WRITE_LSE is off)
    else:
        o, lse = scratch if scratch is not None else alloc_scratch(B, H, num_splits, D, q.device)
        assert o.shape[0] >= B and o.shape[1] == H and o.shape[2] >= num_splits and o.shape[3] == D
        assert lse.shape[0] >= B and lse.shape[1] == H and lse.shape[2] >= num_splits
        assert o.dtype == lse.dtype == torch.float32 and o.stride(-1) == 1 and lse.stride(-1) == 1
        stride_os = o.stride(2)
    if fuse:
        assert counters.dtype == torch.int32 and counters.is_contiguous() and counters.shape[1] == KV
        assert counters.shape[0] >= B
    _split_kernel[(B, KV, num_splits)](
        q, k_pages, v_pages, block_tables, context_lens, o, lse, D ** -0.5,
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2), block_tables.stride(0),
        o.stride(0), o.stride(1), stride_os, lse.stride(0), lse.stride(1),
        G=G, D=D, PAGE=page, S=num_splits, BLOCK_G=max(16, triton.next_power_of_2(G)), BLOCK_N=block_n,
        UPCAST=INTERPRETED, WRITE_LSE=num_splits > 1, out_ptr=out, count_ptr=counters if fuse else out,
        stride_outb=out.stride(0), stride_outh=out.stride(1), FUSE=fuse,
        PDL=pdl and num_splits > 1 and not fuse and use_pdl(q.device),
        BLOCK_S=triton.next_power_of_2(num_splits), **launch_options(num_warps, num_stages))
    if num_splits > 1 and not fuse:
        combine_splits(o, lse, out, num_splits, pdl)
    return out


def choose_num_splits(batch: int, num_kv_heads: int, num_sms: int, max_context_len: int, head_dim: int = 128,
                      block_n: int = SPLIT_BLOCK_N, waves: int | None = None, min_tiles: int = MIN_TILES_PER_SPLIT,
                      max_splits: int = MAX_SPLITS) -> int:
    """How many splits S: enough programs to fill the GPU, none of them too short.

      1. B * KV programs already fill the SMs (>= num_sms): S = 1, nothing to gain but a combine.
      2. Otherwise aim for `waves` programs per SM (target_waves: 8 at head dim 64, 4 at 128):
         S = ceil(waves * num_sms / (B * KV)).
      3. No split shorter than `min_tiles` tiles of the longest context:
         S <= max(1, floor(ceil(max_context_len / block_n) / min_tiles)); and S <= max_splits.
      4. Trim S to the splits the longest context actually fills: with t tiles and
         ceil(t / S) tiles per split, only ceil(t / ceil(t / S)) splits hold keys.

    Defaults: min_tiles 4 (256 keys at block_n 64, cf. vLLM v2's 512-token partitions), max_splits
    128. For llama-8b (KV = 8, head dim 128: 4 waves) on 132 SMs at block_n 64:
      batch 1:  8 programs; step 2 asks ceil(528 / 8) = 66 splits;
                32k context: 512 tiles, cap 128, 66 -> 8 tiles per split -> trimmed to 64 (512 programs);
                4k context:  64 tiles, cap 16 -> S = 16 (128 programs, 4 tiles each);
                1k context:  16 tiles, cap 4  -> S = 4; 128 keys: S = 1.
      batch 64: 512 programs >= 132 SMs -> S = 1 (the one-program kernel, no combine).
    In between, batch 8 at 32k: 64 programs -> S = ceil(528 / 64) = 9 (t = 512: 57 tiles each, 9 full).
    llama-1b (head dim 64: 8 waves) at batch 1 / 32k: ceil(1056 / 8) = 132, capped at 128.
    Under a CUDA graph S is frozen at capture: pass the longest context the graph may serve
    (max_model_len); shorter sequences then fill fewer splits and the rest exit at once.
    """
    programs = batch * num_kv_heads
    if programs >= num_sms:
        return 1
    waves = target_waves(head_dim, block_n) if waves is None else waves
    splits = math.ceil(waves * num_sms / programs)
    tiles = max(1, math.ceil(max_context_len / block_n))
    splits = max(1, min(splits, tiles // min_tiles, max_splits))
    return math.ceil(tiles / math.ceil(tiles / splits))
