"""Every phase's prefill attention (and p01's decode) reaches one of SDPA's fused kernels. Those
take 4-D inputs only; 3-D ones silently fall back to the math kernel, which writes out the
(heads, T, T) scores and, with enable_gqa, copies K/V per query head. The kernel list is narrowed to
FlashAttention (which PyTorch also has on CPU): a 3-D call would find no kernel and raise."""
import importlib

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
