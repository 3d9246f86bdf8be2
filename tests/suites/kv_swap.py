"""Swapping K/V blocks to host memory and back (preemption="swap"): what save() copied, restore()
writes back into any blocks, and on a GPU neither copy makes the host wait: the block ids travel
from pinned memory without blocking (the step keeps its one sync, the sampled tokens)."""
import importlib
from types import SimpleNamespace

import pytest
import torch

SHAPE = SimpleNamespace(num_layers=2, num_kv_heads=2, head_dim=8,     # what KVCache reads of a model
                        is_mla=False)                                  # (p17 on: a latent pool, or K and V)


def _cache(phase, device):
    KVCache = importlib.import_module(f"phases.{phase}.kv_cache").KVCache      # noqa: N806
    cache = KVCache(SHAPE, 8, 4, device, torch.float32)
    for layer in cache.layers:
        layer.copy_(torch.randn(layer.shape, generator=torch.Generator().manual_seed(0)).to(device))
    return cache


def test_restore_writes_back_what_save_copied(phase):
    cache = _cache(phase, "cpu")
    before = [layer[:, [1, 3]].clone() for layer in cache.layers]
    saved = cache.save([1, 3])
    for layer in cache.layers:
        layer[:, [1, 3]] = 0                       # the blocks go to other sequences meanwhile
    cache.restore([6, 2], saved)
    assert all(torch.equal(layer[:, [6, 2]], b) for layer, b in zip(cache.layers, before))


@pytest.mark.gpu
def test_swap_copies_make_no_host_sync(phase):
    """torch.tensor(block_ids, device="cuda") copies from pageable memory and waits for the GPU."""
    cache = _cache(phase, "cuda")
    cache.restore([5, 6], cache.save([1, 3]))      # warm-up: pinned buffers, kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        cache.restore([5, 6], cache.save([1, 3]))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert all(torch.equal(layer[:, [5, 6]], layer[:, [1, 3]]) for layer in cache.layers)
