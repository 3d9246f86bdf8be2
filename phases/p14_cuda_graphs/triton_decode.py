"""Paged decode attention in Triton: one new token per sequence reads its K/V where they live.

One program per (sequence, KV head) serves every query head of its group (GQA): the group's
G queries stay in registers while the program walks the sequence's context, BLOCK_N keys at a
time, each key found through the block table (key j of sequence b is slot
table[b, j // page_size] * page_size + j % page_size, any page size). Softmax is online, in fp32:
a running max m and sum l per query row rescale the accumulator as each tile arrives, so the
whole context is read once and never stored. Keys past the sequence's length are masked.

Shapes: q (B, H, D); k_pages, v_pages (num_pages, page_size, KV, D); block_tables (B, max_pages)
int32; context_lens (B,) int32; returns (B, H, D) in q's dtype.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Under TRITON_INTERPRET=1 (CPU) the interpreter computes bf16 wrongly: loads are cast to fp32.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _paged_decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, scale,
                         stride_qb, stride_qh, stride_kp, stride_ks, stride_kh,
                         stride_tb, stride_ob, stride_oh,
                         G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                         BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    b, kv = tl.program_id(0), tl.program_id(1)
    length = tl.load(lens_ptr + b)
    rows = tl.arange(0, BLOCK_G)                     # query heads of this group (padded to BLOCK_G)
    dims = tl.arange(0, D)
    row_ok = rows < G
    q = tl.load(q_ptr + b * stride_qb + (kv * G + rows)[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None], other=0.0)     # (BLOCK_G, D)
    if UPCAST:
        q = q.to(tl.float32)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)   # running max of each row's scores
    l = tl.zeros([BLOCK_G], tl.float32)                  # running sum of exp(score - m)
    acc = tl.zeros([BLOCK_G, D], tl.float32)             # running sum of p * v
    for start in range(0, length, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < length
        page = tl.load(table_ptr + b * stride_tb + keys // PAGE, mask=key_ok, other=0)
        slot = page.to(tl.int64) * stride_kp + (keys % PAGE) * stride_ks + kv * stride_kh   # (BLOCK_N,)
        k = tl.load(k_ptr + slot[:, None] + dims[None, :], mask=key_ok[:, None], other=0.0)  # (BLOCK_N, D)
        v = tl.load(v_ptr + slot[:, None] + dims[None, :], mask=key_ok[:, None], other=0.0)
        if UPCAST:
            k, v = k.to(tl.float32), v.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * scale                               # (BLOCK_G, BLOCK_N) fp32
        s = tl.where(key_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)                                        # rescale what came before
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    out = acc / l[:, None]
    tl.store(out_ptr + b * stride_ob + (kv * G + rows)[:, None] * stride_oh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def paged_decode(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, block_n: int = 64, out: torch.Tensor | None = None) -> torch.Tensor:
    """Launch one program per (sequence, KV head); `out` (B, H, D) may be given (a test poisons it)."""
    B, H, D = q.shape
    _, page, KV, _ = k_pages.shape
    G = H // KV
    assert k_pages.stride() == v_pages.stride() and k_pages.stride(-1) == 1 and q.stride(-1) == 1
    assert D & (D - 1) == 0, f"head_dim {D} must be a power of two"
    out = torch.empty_like(q) if out is None else out
    _paged_decode_kernel[(B, KV)](
        q, k_pages, v_pages, block_tables, context_lens, out, D ** -0.5,
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        G=G, D=D, PAGE=page, BLOCK_G=max(16, triton.next_power_of_2(G)), BLOCK_N=block_n, UPCAST=INTERPRETED)
    return out
