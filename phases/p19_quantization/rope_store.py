"""Rotary embedding and the K/V write in one Triton kernel: what a replayed step still pays for.

Once a CUDA graph removes the launches, a decode step costs what its kernels take on the GPU, and
on llama-1b at batch 1 about a seventh of that was the rotary embedding and the K/V store: eight
tiny kernels per layer (an upcast, a negate, a concatenation, two multiplies, an add, a downcast,
two index copies), each a few microseconds for a few kilobytes. One kernel does all of it:

  program (t, h), one per token and head of q and k:
    x = qkv[t, h] in fp32 (D values: halves x1, x2), c, s = cos[pos[t]], sin[pos[t]]
    out = (x1 * c - x2 * s, x2 * c + x1 * s)           the half-split ("rotate_half") layout
    a q head: written back in place; a k head: written to the pool at slot[t], and v's head beside it

Shapes: qkv (T, H + 2 KV, D) in the model's dtype, rotated in place (its q part is then the
attention's q); positions, slots (T,) int64; cos, sin (max_position, D) fp32 (the model's
tables); k_pages, v_pages (num_slots, KV, D) views of one layer's pool. On a CPU the torch
reference runs instead (layers.apply_rotary and KVCache.store), unless TRITON_INTERPRET=1.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_store_kernel(qkv_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, k_ptr, v_ptr,
                       stride_t, stride_h, stride_cos, stride_slot, stride_kvh,
                       H: tl.constexpr, KV: tl.constexpr, HALF: tl.constexpr):
    t, h = tl.program_id(0), tl.program_id(1)          # token, head among H q heads then KV k heads
    dims = tl.arange(0, HALF)
    pos = tl.load(pos_ptr + t)
    c = tl.load(cos_ptr + pos * stride_cos + dims)       # the table's halves are equal: read one
    s = tl.load(sin_ptr + pos * stride_cos + dims)
    row = qkv_ptr + t * stride_t + h * stride_h
    x1 = tl.load(row + dims).to(tl.float32)
    x2 = tl.load(row + HALF + dims).to(tl.float32)
    out1 = (x1 * c - x2 * s).to(qkv_ptr.dtype.element_ty)
    out2 = (x2 * c + x1 * s).to(qkv_ptr.dtype.element_ty)
    if h < H:                                            # a query head: rotated in place
        tl.store(row + dims, out1)
        tl.store(row + HALF + dims, out2)
    else:                                                # a key head: rotated into the pool, v beside it
        kv = h - H
        slot = tl.load(slot_ptr + t)
        dst = slot * stride_slot + kv * stride_kvh
        tl.store(k_ptr + dst + dims, out1)
        tl.store(k_ptr + dst + HALF + dims, out2)
        v_row = row + KV * stride_h                      # v head kv sits KV heads after k head kv
        tl.store(v_ptr + dst + dims, tl.load(v_row + dims))
        tl.store(v_ptr + dst + HALF + dims, tl.load(v_row + HALF + dims))


def rope_and_store(qkv: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Rotate q and k of qkv (T, H + 2 KV, D) in place, write k and v to the pool; returns q (T, H, D)."""
    T, heads, D = qkv.shape
    KV = (heads - num_heads) // 2
    assert qkv.stride(2) == 1 and k_pages.stride() == v_pages.stride() and k_pages.stride(-1) == 1
    assert D % 2 == 0 and (D // 2) & (D // 2 - 1) == 0, f"head_dim {D}: its half must be a power of two"
    _rope_store_kernel[(T, num_heads + KV)](
        qkv, positions, slots, cos, sin, k_pages, v_pages,
        qkv.stride(0), qkv.stride(1), cos.stride(0), k_pages.stride(0), k_pages.stride(1),
        H=num_heads, KV=KV, HALF=D // 2)
    return qkv[:, :num_heads]
