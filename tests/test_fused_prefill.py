"""Every phase's prefill attention (and p01's decode) reaches one of SDPA's fused kernels. Those
take 4-D inputs only; 3-D ones silently fall back to the math kernel, which writes out the
(heads, T, T) scores and, with enable_gqa, copies K/V per query head. The kernel list is narrowed to
FlashAttention (which PyTorch also has on CPU): a 3-D call would find no kernel and raise."""
import importlib
import importlib.resources

import pytest
import torch
from torch.nn.attention import SDPBackend


# phase -> (module holding _causal, name of its kernel list)
PHASES = {**{p: ("attention", "BACKENDS") for p in
             ("p02_paged_kv", "p03_vectorized_gather", "p04_replica_pipeline", "p05_decode_profiling")},
          **{p: ("attention_backends", "SDPA_KERNELS") for p in
             ("p06_paged_attention", "p07_triton_decode", "p08_preemption", "p09_http_serving", "p10_review")}}


@pytest.mark.parametrize("phase", sorted(PHASES))
def test_prefill_runs_a_fused_kernel(phase, monkeypatch):
    module_name, kernels = PHASES[phase]
    module = importlib.import_module(f"phases.{phase}.{module_name}")
    torch.manual_seed(0)
    T, H, KV, D = 37, 8, 2, 16
    q, k, v = torch.randn(T, H, D), torch.randn(T, KV, D), torch.randn(T, KV, D)
    reference = module._causal(q, k, v)                         # with the phase's own kernel list
    monkeypatch.setattr(module, kernels, [SDPBackend.FLASH_ATTENTION])
    out = module._causal(q, k, v)                               # raises if no fused kernel takes it
    assert out.shape == (T, H, D)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("T, causal", [(37, True), (1, False)])      # prefill, and a decode step
def test_p01_attention_runs_a_fused_kernel(T, causal):
    """p01 attends in one SDPA call for prefill and decode alike (no kernel list of its own)."""
    from torch.nn.attention import sdpa_kernel

    from phases.p01_serial_decode.attention import Attention
    torch.manual_seed(0)
    q, k, v = torch.randn(T, 8, 16), torch.randn(40, 2, 16), torch.randn(40, 2, 16)
    k, v = (k[:T], v[:T]) if causal else (k, v)
    reference = Attention._attend(None, q, k, v, causal)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = Attention._attend(None, q, k, v, causal)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)


CHUNKED = [f"p{n:02d}" for n in range(11, 20)]      # phases whose prefill attends a chunk after cached keys


@pytest.mark.parametrize("tag", CHUNKED)
def test_a_masked_chunk_never_asks_for_gqa_with_a_mask(tag, monkeypatch):
    """A chunk after cached keys needs a mask; on a GPU no fused kernel takes a mask and GQA
    together, and the math kernel writes out (heads, n, context) scores. So the masked call gets
    K/V repeated per query head and enable_gqa off; its output is causal attention aligned to the end."""
    phase = next(p.name for p in (importlib.resources.files("phases")).iterdir() if p.name.startswith(tag + "_"))
    module = importlib.import_module(f"phases.{phase}.attention_backends")
    calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def watched(q, k, v, attn_mask=None, is_causal=False, enable_gqa=False):
        calls.append((attn_mask is not None, enable_gqa, q.shape[1], k.shape[1]))
        return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=enable_gqa)
    monkeypatch.setattr(module.F, "scaled_dot_product_attention", watched)
    torch.manual_seed(0)
    n, context, H, KV, D = 5, 19, 8, 2, 16
    q, k, v = torch.randn(n, H, D, dtype=torch.float64), *torch.randn(2, context, KV, D, dtype=torch.float64)
    out = module._causal(q, k, v)
    assert calls == [(True, False, H, H)]                     # masked, K/V per query head, no GQA flag
    kh, vh = (x.repeat_interleave(H // KV, dim=1) for x in (k, v))
    scores = torch.einsum("nhd,chd->hnc", q, kh) / D ** 0.5
    seen = torch.ones(n, context, dtype=torch.bool).tril(context - n)
    expected = torch.einsum("hnc,chd->nhd", scores.masked_fill(~seen, float("-inf")).softmax(-1), vh)
    torch.testing.assert_close(out, expected)
    module._causal(q, k[:n], v[:n])                           # no cached keys: SDPA's causal mask, GQA
    assert calls[-1] == (False, True, H, KV)
