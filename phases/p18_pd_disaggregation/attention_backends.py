"""Attention backends: who computes attention over the paged pool, behind one small interface.

A backend has three methods. The model runner calls prepare(step) once per step (anything a
backend derives from the step's metadata is made there, not in every layer); each layer writes
the step's new K/V into the pool, then calls prefill(q, k_pages, v_pages, step) when some
sequence computes more than one token (prompt chunks, decode rows mixed in), else
decode(q, k_pages, v_pages, step). Shapes:
  q (T, H, D) new queries; sequence b's are rows [cu_seqlens_q[b], cu_seqlens_q[b+1]), at the
  last q_b positions of its context: query i of a chunk starting at position s sees keys [0, s + i];
  k_pages, v_pages (num_blocks, block_size, KV, D): one layer's pool, where K/V live (the chunk's
  own keys included: they were written before attention runs);
  step.block_tables (B, max_blocks) int32, step.context_lens (B,) int32: where each sequence's
  keys are and how many. Returns (T, H, D).

  torch       the reference: exact, runs everywhere (CPU, CI). Decode gathers each sequence's
              blocks into a padded batch and masks the padding; prefill gathers each sequence's
              keys [0, context) and runs one SDPA per sequence, masked causally from the chunk's
              first position. What it does is what a paged kernel must match.
  flash-attn  FlashAttention 4 (package flash-attn-4, module flash_attn.cute), GPU only: decode
              and prefill read K/V in place through the block table (no gather, no padding),
              prefill as varlen queries in one call.
  triton      our own paged decode kernel (triton_decode.py), split-K: a sequence's keys over
              several programs where the batch alone leaves SMs idle (long context, small batch);
              prefill is the torch reference's. On a GPU, or on CPU under TRITON_INTERPRET=1.
  auto        on a GPU flash-attn when it imports, else triton (both run inside a CUDA graph; the
              torch reference cannot); on CPU torch.
"""
from __future__ import annotations

import importlib.util
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .mla import latent_decode_reference

# The SDPA kernels the torch backend may use: all but cuDNN's, which builds an execution plan
# for every new shape (milliseconds of host time per call on an H200): a decode step's key
# length is new every step.
SDPA_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class TorchAttention:
    """The reference backend: PyTorch SDPA over K/V gathered out of the pool."""
    name = "torch"

    def prepare(self, step) -> None:
        step.block_index = step.block_tables.long()         # an index must be int64: once, not per layer
        if not step.is_prefill:   # (B, 1, 1, S) additive mask: 0 for a real key, -inf past the end
            S = step.max_context_len
            keys = torch.arange(S, device=step.context_lens.device)
            real = keys[None, :] < step.context_lens[:, None]
            step.key_mask = torch.zeros(real.shape, dtype=step.dtype, device=real.device) \
                .masked_fill_(~real, float("-inf"))[:, None, None, :]

    def prefill(self, q, k_pages, v_pages, step) -> torch.Tensor:
        # Sequence b: its queries are rows [a, e); its keys, positions [0, context), are gathered
        # from its first ceil(context / block_size) blocks (host ints size it: no device read).
        block_size, out = k_pages.shape[1], []
        spans = zip(step.cu_seqlens_q_host, step.cu_seqlens_q_host[1:], step.context_lens_host)
        for b, (a, e, context) in enumerate(spans):
            blocks = step.block_index[b, :-(-context // block_size)]
            k, v = (pages[blocks].flatten(0, 1)[:context] for pages in (k_pages, v_pages))
            out.append(_causal(q[a:e], k, v))
        return torch.cat(out)

    def decode(self, q, k_pages, v_pages, step) -> torch.Tensor:
        # Gather: block table (B, W) -> (B, W * block_size, KV, D), the first S keys kept.
        # GQA: the H / KV query heads sharing a KV head act as that head's query rows.
        B, KV, D = q.shape[0], k_pages.shape[2], q.shape[2]
        k, v = (pages[step.block_index].flatten(1, 2)[:, :step.max_context_len] for pages in (k_pages, v_pages))
        with sdpa_kernel(SDPA_KERNELS):
            out = F.scaled_dot_product_attention(q.view(B, KV, -1, D), k.transpose(1, 2), v.transpose(1, 2),
                                                 attn_mask=step.key_mask)
        return out.reshape(B, -1, D)           # reshape: the efficient kernel returns G strided apart

    def latent_decode(self, q, pool, rank: int, scale: float, step) -> torch.Tensor:
        """MLA's absorbed decode (mla.py): q (B, H, W) over the cached rows -> (B, H, rank)."""
        return latent_decode_reference(q, pool, rank, scale, step)


def _causal(q, k, v) -> torch.Tensor:
    """q (n, H, D) at the last n of k's positions; k, v (context, KV, D). Query i sees keys
    [0, context - n + i]: causal, aligned to the end (a chunk's first query sees every cached key)."""
    n, context = q.shape[0], k.shape[0]
    # From position 0 that is SDPA's own causal mask (aligned to the start); one query sees every
    # key; otherwise a boolean (n, context) mask, True where a key may be seen.
    mask = None if n == 1 or n == context else \
        torch.ones(n, context, dtype=torch.bool, device=q.device).tril(context - n)
    # On a GPU no fused kernel takes a mask and GQA together (FlashAttention: no mask; the
    # memory-efficient one: no GQA), and the math kernel writes out (heads, n, context) scores:
    # 4 GiB for a 2048-token chunk over 32k keys on llama-8b. A masked call gets K/V repeated per
    # query head instead (context x H x D: what enable_gqa would have indexed).
    gqa = mask is None
    if not gqa and k.shape[1] != q.shape[1]:
        k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    # (n, heads, D) -> (1, heads, n, D) for SDPA and back (its fused kernels take 4-D inputs only;
    # 3-D ones fall back to the math kernel); enable_gqa reads kv head h // (H / KV).
    with sdpa_kernel(SDPA_KERNELS):
        out = F.scaled_dot_product_attention(*(x.transpose(0, 1)[None] for x in (q, k, v)), attn_mask=mask,
                                             is_causal=n == context and n > 1, enable_gqa=gqa)
    return out[0].transpose(0, 1)


class FlashAttention:
    """FlashAttention 4: paged decode and varlen prefill in one kernel call each per layer."""
    name = "flash-attn"

    def __init__(self):
        from flash_attn.cute import flash_attn_varlen_func    # imported only when chosen
        self.varlen = flash_attn_varlen_func

    def prepare(self, step) -> None:
        pass                                   # block tables, lengths, cu_seqlens: int32 already

    def prefill(self, q, k_pages, v_pages, step) -> torch.Tensor:
        # Varlen queries over paged keys: sequence b's rows read its first context_lens[b] keys
        # through its row of the block table. With fewer queries than keys, FlashAttention aligns
        # the causal mask to the end: the last query sees every key, as a chunk's must.
        out = self.varlen(q, k_pages, v_pages, cu_seqlens_q=step.cu_seqlens_q, max_seqlen_q=step.max_query_len,
                          seqused_k=step.context_lens, max_seqlen_k=step.max_context_len,
                          page_table=step.block_tables, causal=True)
        return _output(out)

    def decode(self, q, k_pages, v_pages, step) -> torch.Tensor:
        # q as a batch of one-token sequences (B, 1, H, D); each reads its first context_lens[b]
        # keys through its row of the block table. Rows past the end of a sequence's last block
        # are loaded and masked: they must be finite, which the zero-filled pool guarantees.
        out = self.varlen(q.unsqueeze(1), k_pages, v_pages, seqused_k=step.context_lens,
                          page_table=step.block_tables)
        return _output(out).squeeze(1)


class TritonAttention(TorchAttention):
    """Decode through our Triton kernel; prefill (its gather and per-sequence SDPA) is the reference's.

    The split count comes from shapes and host ints only, never a device read: the rows (a graph's
    bucket), the KV heads, the SMs, and step.max_context_len (a graph's capacity: its block-table
    width; an eager step's longest context). So a captured graph keeps one count for every replay."""
    name = "triton"
    INTERPRETER_SMS = 8          # on CPU (the interpreter): a small GPU, so that tests split

    def __init__(self):
        from .triton_decode import choose_num_splits, paged_decode     # imports triton only when chosen
        self.paged_decode, self.choose_num_splits = paged_decode, choose_num_splits
        self.num_sms = None

    def sm_count(self, q) -> int:
        if self.num_sms is None:
            self.num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count \
                if q.is_cuda else self.INTERPRETER_SMS
        return self.num_sms

    def splits(self, q, k_pages, step) -> int:
        return self.choose_num_splits(q.shape[0], k_pages.shape[2], self.sm_count(q), step.max_context_len,
                                      q.shape[-1])

    def prepare(self, step) -> None:
        if step.is_prefill:                    # the reference's prefill indexes the block table;
            super().prepare(step)              # the kernel masks by context_lens itself

    def decode(self, q, k_pages, v_pages, step) -> torch.Tensor:
        return self.paged_decode(q.contiguous(), k_pages, v_pages, step.block_tables, step.context_lens,
                                 self.splits(q, k_pages, step))

    def latent_decode(self, q, pool, rank: int, scale: float, step) -> torch.Tensor:
        """MLA: one latent "KV head" shared by all H query heads (triton_mla.py), split by its own
        rule (more splits: one KV head makes few programs), from host ints as above."""
        from .triton_mla import choose_latent_splits, latent_decode
        splits = choose_latent_splits(q.shape[0], self.sm_count(q), step.max_context_len)
        return latent_decode(q, pool, step.block_tables, step.context_lens, rank, scale, splits)


def _output(out) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out       # some versions return (out, lse)


BACKENDS = {"torch": TorchAttention, "flash-attn": FlashAttention, "triton": TritonAttention}


def flash_attn_available() -> bool:
    return importlib.util.find_spec("flash_attn") is not None and \
        importlib.util.find_spec("flash_attn.cute") is not None


def resolve_backend(name: str, device: str) -> str:
    """The backend an engine option names, checked now: "auto" picks; an impossible choice is a
    clear error at construction, not a failure in the first step."""
    if name == "auto":
        if not device.startswith("cuda"):
            return "torch"
        return "flash-attn" if flash_attn_available() else "triton"
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {['auto', *BACKENDS]}, got {name!r}")
    if name == "flash-attn" and not device.startswith("cuda"):
        raise ValueError("attention_backend='flash-attn' needs a CUDA device; use 'torch' on CPU")
    if name == "triton" and not (device.startswith("cuda") or os.environ.get("TRITON_INTERPRET") == "1"):
        raise ValueError("attention_backend='triton' needs a CUDA device, or TRITON_INTERPRET=1 set before "
                         "the first import of triton to run its kernel in the interpreter on CPU")
    if name == "flash-attn" and not flash_attn_available():
        raise ValueError("attention_backend='flash-attn' needs the flash-attn-4 package "
                         "(module flash_attn.cute), which is not installed; see this phase's README")
    return name


def make_backend(name: str):
    return BACKENDS[name]()
