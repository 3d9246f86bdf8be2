"""p14_cuda_graphs: the fused add+RMSNorm and SiLU*mul kernels against the torch ops they replace,
in Triton's interpreter on CPU: one fresh process (TRITON_INTERPRET=1 must be set before triton is
first imported). fp32 within 1e-6; bf16 within one unit in the last place for the stream, two for
what is computed from it (the interpreter rounds its bf16 conversions its own way; on a GPU both
round to nearest even: the GPU test below checks that)."""

import pytest

from tests.interpreted import run_interpreted

PHASE = "p14_cuda_graphs"

# Rows 1-3; widths a power of two (64), SmolLM2's 576 and an odd 100 (masked tails).
# Last stdout line: a JSON list, one entry per (dtype, shape), each error relative to the reference's max.
INTERPRETED = f"""
import json
import torch
import torch.nn.functional as F
from phases.{PHASE}.fused_elementwise import add_rms_norm, silu_and_mul
torch.manual_seed(0)
def err(got, ref):
    return ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
out = []
for dtype in (torch.float32, torch.bfloat16):
    for T, dim in ((3, 576), (1, 64), (2, 100)):
        x, res, w = torch.randn(T, dim, dtype=dtype), torch.randn(T, dim, dtype=dtype), torch.randn(dim, dtype=dtype)
        stream = res.clone()
        fused = add_rms_norm(x, stream, w, 1e-5)
        x_before = x.clone()
        plain = add_rms_norm(x, None, w, 1e-5)
        gate_up = torch.randn(T, 2 * dim, dtype=dtype)
        out.append({{"dtype": str(dtype), "stream": err(stream, x + res),
                    "norm": err(fused, F.rms_norm(x + res, (dim,), w, 1e-5)),
                    "plain": err(plain, F.rms_norm(x, (dim,), w, 1e-5)), "x_untouched": bool((x == x_before).all()),
                    "silu": err(silu_and_mul(gate_up), F.silu(gate_up[:, :dim]) * gate_up[:, dim:])}})
from phases.{PHASE} import kernel_bench
print(json.dumps({{"cases": out, "fusion": kernel_bench.check_fused("cpu", torch.float32)}}))
"""


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(INTERPRETED)


def bound(case: dict) -> float:
    return 1e-6 if case["dtype"] == "torch.float32" else 2 ** -7     # bf16: 8 significant bits


def test_add_rms_norm_writes_the_stream_and_normalizes_it(interpreted):
    for case in interpreted["cases"]:
        assert case["stream"] <= bound(case) and case["norm"] <= 2 * bound(case), case


def test_rms_norm_without_a_residual_writes_nothing_but_its_output(interpreted):
    for case in interpreted["cases"]:
        assert case["plain"] <= 2 * bound(case) and case["x_untouched"], case


def test_silu_and_mul_matches_silu_then_multiply(interpreted):
    for case in interpreted["cases"]:
        assert case["silu"] <= 2 * bound(case), case


def test_make_kernel_checks_each_fused_kernel_against_the_ops_it_replaces(interpreted):
    """`make phase-14 kernel` (kernel_bench.check_fused): rope + K/V store, add + RMSNorm and SiLU * up,
    each against layers.py's torch ops, outputs and in-place writes alike, before it times them."""
    checks = interpreted["fusion"]
    assert {c["kernel"] for c in checks} == {"rope_store", "add_rms_norm", "silu_and_mul"}
    assert all(c["ok"] for c in checks), checks


@pytest.mark.gpu
def test_make_kernel_checks_pass_in_bf16_on_a_gpu():
    import torch

    from phases.p14_cuda_graphs import kernel_bench
    assert all(c["ok"] for c in kernel_bench.check_fused("cuda", torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("T, dim, inter", [(1, 2048, 8192), (64, 4096, 14336), (7, 576, 1536)])
def test_on_a_gpu_the_fused_kernels_round_like_the_ops_they_replace(T, dim, inter):
    """bf16 on the GPU, the model shapes (llama-1b, llama-8b, SmolLM2): the stream and SiLU*mul bit
    for bit (the same roundings), the norm within one bf16 unit of F.rms_norm (another summation
    order)."""
    import torch
    import torch.nn.functional as F

    from phases.p14_cuda_graphs.fused_elementwise import add_rms_norm, silu_and_mul
    g = torch.Generator(device="cuda").manual_seed(0)
    x, res, w = (torch.randn(*shape, generator=g, device="cuda").bfloat16() for shape in ((T, dim), (T, dim), (dim,)))
    stream = res.clone()
    fused = add_rms_norm(x, stream, w, 1e-5)
    assert torch.equal(stream, x + res)
    ref = F.rms_norm(x + res, (dim,), w, 1e-5)
    assert ((fused.float() - ref.float()).abs() <= ref.float().abs() * 2 ** -7 + 1e-6).all()
    gate_up = torch.randn(T, 2 * inter, generator=g, device="cuda").bfloat16()
    assert torch.equal(silu_and_mul(gate_up), F.silu(gate_up[:, :inter]) * gate_up[:, inter:])
