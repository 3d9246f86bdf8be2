"""The hardware limit, measured in the same run as the benchmark.

A decode step must at least read every weight once and every cached K/V it attends to, so
  floor(step) = (weight bytes + KV bytes read) / copy bandwidth.
We measure the bandwidth with a large device-to-device copy (bytes read + bytes written) and the
matmul rate with a large bf16 (GPU) or fp32 (CPU) matrix product, on random data.
"""
from __future__ import annotations

import time

import torch

from .device import synchronize
from .model_config import ModelConfig


def _time(fn, device: str, repeats: int) -> float:
    fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def copy_bandwidth(device: str) -> float:
    """Bytes per second of a device-to-device copy, counting the read and the write."""
    n = (1 << 30) if device.startswith("cuda") else (1 << 26)   # 2 GiB / 128 MiB of bf16
    src = torch.randn(n, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    seconds = _time(lambda: dst.copy_(src), device, repeats=10)
    return 2 * src.numel() * src.element_size() / seconds


def matmul_rate(device: str) -> float:
    """FLOP/s of a square matrix product (bf16 on GPU, fp32 on CPU)."""
    cuda = device.startswith("cuda")
    n, dtype = (8192, torch.bfloat16) if cuda else (1024, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    seconds = _time(lambda: a @ b, device, repeats=10)
    return 2 * n ** 3 / seconds


def measure(device: str) -> dict:
    return {"copy_bytes_per_s": copy_bandwidth(device), "matmul_flop_per_s": matmul_rate(device)}


def decode_floor_s(cfg: ModelConfig, dtype: torch.dtype, context_tokens: int, bandwidth: float,
                   linear_elem: int | None = None) -> float:
    """Fewest seconds one decode step can take: weights read once + KV of `context_tokens`
    (summed over the batch) read once. linear_elem: the bytes of a weight of the layers' 8-bit
    Linears (a quantized model: 1), the rest in `dtype`."""
    elem = torch.tensor([], dtype=dtype).element_size()
    weight_bytes = cfg.num_params() * elem
    if linear_elem is not None:
        weight_bytes -= quantized_params(cfg) * (elem - linear_elem)
    kv_bytes = context_tokens * cfg.kv_bytes_per_token(dtype)
    return (weight_bytes + kv_bytes) / bandwidth


def quantized_params(cfg: ModelConfig) -> int:
    """The weights W8A8 stores in 8 bits: every layer's q/k/v, o, gate/up and down (MLA: o,
    gate/up and down; its latent projections stay), not the embedding, the LM head or the norms."""
    d, f = cfg.hidden_size, cfg.intermediate_size
    if cfg.is_mla:
        attn = cfg.num_heads * cfg.v_head_dim * d
    else:
        attn = d * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
    return cfg.num_layers * (attn + 3 * d * f)
