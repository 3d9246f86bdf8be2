"""p14_cuda_graphs: the fused rotary + K/V-store kernel against the reference it replaces
(layers.apply_rotary, then KVCache.store), in Triton's interpreter on CPU: one fresh process
(TRITON_INTERPRET=1 must be set before triton is first imported)."""

import pytest

from tests.interpreted import run_interpreted

PHASE = "p14_cuda_graphs"

# Shapes: a Llama GQA group (H 4, KV 2), a Qwen2-like one (H 7, KV 1), head dims 16 and 128;
# positions anywhere in the table, slots scattered over the pool, the pool poisoned with NaN
# everywhere the kernel must not write. Last stdout line: a JSON list, one entry per shape.
INTERPRETED = f"""
import json
import torch
from phases.{PHASE}.layers import apply_rotary
from phases.{PHASE}.rope_store import rope_and_store
torch.manual_seed(0)
out = []
for T, H, KV, D in ((5, 4, 2, 16), (3, 7, 1, 128), (1, 4, 2, 16)):
    max_pos, num_slots = 64, 40
    qkv = torch.randn(T, H + 2 * KV, D)
    freqs = torch.rand(max_pos, D // 2) * 6
    angles = torch.cat([freqs, freqs], -1)
    cos, sin = angles.cos(), angles.sin()
    pos = torch.randperm(max_pos)[:T]
    slots = torch.randperm(num_slots)[:T]
    k_pages = torch.full((num_slots, KV, D), float("nan"))
    v_pages = torch.full((num_slots, KV, D), float("nan"))
    ref = apply_rotary(qkv[:, :H + KV], cos[pos][:, None], sin[pos][:, None])
    q = rope_and_store(qkv.clone(), pos, slots, cos, sin, k_pages, v_pages, H)
    untouched = torch.ones(num_slots, dtype=torch.bool)
    untouched[slots] = False
    out.append({{"q": (q - ref[:, :H]).abs().max().item(), "k": (k_pages[slots] - ref[:, H:]).abs().max().item(),
                "v": (v_pages[slots] - qkv[:, H + KV:]).abs().max().item(),
                "rest_untouched": bool(k_pages[untouched].isnan().all() and v_pages[untouched].isnan().all())}})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def interpreted() -> list:
    return run_interpreted(INTERPRETED)


def test_kernel_rotates_q_and_k_and_writes_k_and_v_like_the_reference(interpreted):
    """fp32 throughout: the kernel's q, the pool's k at each slot and v are the reference's."""
    for shape in interpreted:
        assert shape["q"] < 1e-6 and shape["k"] < 1e-6 and shape["v"] == 0.0, shape


def test_kernel_writes_no_other_slot(interpreted):
    assert all(shape["rest_untouched"] for shape in interpreted)
