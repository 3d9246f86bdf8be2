"""KVCache: the paged KV pool every sequence shares, preallocated once for the engine's life."""
from __future__ import annotations

import torch

from common.model_config import ModelConfig


class KVCache:
    """Per layer one tensor (2, num_blocks, block_size, num_kv_heads, head_dim): K, then V (MLA:
    (1, num_blocks, block_size, 1, latent + rotary key): one row a token, see mla.py).

    Slot s of a layer is [:, s // block_size, s % block_size]; which slots a sequence owns is its
    block table's business (block_manager.py), and attention reads them in place through it
    (attention_backends.py). The pool is zeros, not empty: a kernel may load the rows past a
    sequence's end in its last block and mask their scores, but a zero weight times NaN is still
    NaN, so even slots nobody wrote must hold finite numbers.

    One block more than the block manager hands out, the last: the scratch block. A replayed
    CUDA graph (cuda_graph.py) runs a whole bucket of lanes; the padded ones write there.
    """

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, device: str, dtype: torch.dtype):
        # MLA (mla.py): one row per token, the latent and the shared rotary key, in place of K and V
        # per KV head: (1, num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim).
        shape = (1, num_blocks + 1, block_size, 1, cfg.kv_lora_rank + cfg.qk_rope_head_dim) if cfg.is_mla else \
            (2, num_blocks + 1, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.layers = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.num_blocks, self.block_size = num_blocks, block_size   # blocks the sequences share
        self.scratch_block = num_blocks                             # owned by no sequence

    def store(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k, v (T, num_kv_heads, head_dim): token t goes to slot slot_mapping[t]."""
        kv = self.layers[layer].flatten(1, 2)              # (2, num_slots, num_kv_heads, head_dim), a view
        kv[0].index_copy_(0, slot_mapping, k)
        kv[1].index_copy_(0, slot_mapping, v)

    def store_latent(self, layer: int, slot_mapping: torch.Tensor, rows: torch.Tensor) -> None:
        """MLA: write rows (T, kv_lora_rank + qk_rope_head_dim), token t to slot slot_mapping[t]."""
        self.layers[layer][0].flatten(0, 1)[:, 0].index_copy_(0, slot_mapping, rows)

    def save(self, block_ids: list[int]) -> torch.Tensor:
        """Copy these blocks of every layer to host memory (pinned on a GPU, so the copy does not
        stall the host): (num_layers, 2, n, block_size, num_kv_heads, head_dim). Queued on the
        same stream as the next forward, so it reads the blocks before anything overwrites them.
        (MLA: (num_layers, 1, n, block_size, 1, latent + rotary key).)"""
        index = self._block_index(block_ids)
        shape = (len(self.layers), self.layers[0].shape[0], len(block_ids), *self.layers[0].shape[2:])   # (MLA: 1, not 2)
        host = torch.empty(shape, dtype=self.layers[0].dtype, pin_memory=self.layers[0].is_cuda)
        for saved, layer in zip(host, self.layers):
            saved.copy_(layer[:, index], non_blocking=True)
        return host

    def gather(self, block_ids: list[int]) -> torch.Tensor:
        """These blocks of every layer in one new tensor on the pool's device, as save()'s shape:
        what a KV connector sends (kv_connector.py)."""
        index = self._block_index(block_ids)
        return torch.stack([layer[:, index] for layer in self.layers])

    def restore(self, block_ids: list[int], saved: torch.Tensor) -> None:
        """Write what save() copied into these blocks (as many as were saved, any ids)."""
        index = self._block_index(block_ids)
        for layer, kv in zip(self.layers, saved):
            layer[:, index] = kv.to(layer.device, non_blocking=True)

    def _block_index(self, block_ids: list[int]) -> torch.Tensor:
        """Block ids as a device tensor, copied from pinned host memory without waiting:
        torch.tensor(ids, device=...) copies from pageable memory and blocks the host until the
        GPU has caught up, a second sync in a step that makes one (the sampled tokens)."""
        device = self.layers[0].device
        ids = torch.tensor(block_ids, dtype=torch.long, pin_memory=device.type == "cuda")
        return ids.to(device, non_blocking=True)


def memory_budget(device: str, gpu_memory_utilization: float, cpu_bytes: int) -> int:
    """Bytes for the KV pool: a share of the GPU memory free now (weights already loaded, the
    rest is headroom for activations), or a fixed budget on CPU."""
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free * gpu_memory_utilization)
    return cpu_bytes


def num_blocks_for(cfg: ModelConfig, dtype: torch.dtype, block_size: int, budget_bytes: int,
                   max_useful_blocks: int) -> int:
    """How many blocks the budget buys, but no more than the engine could ever fill."""
    block_bytes = block_size * cfg.kv_bytes_per_token(dtype)      # K and V, every layer
    if budget_bytes < block_bytes:
        raise ValueError(f"a KV budget of {budget_bytes} bytes holds no block of {block_bytes} bytes")
    return min(budget_bytes // block_bytes, max_useful_blocks)
