"""EngineConfig: every knob of this engine, validated once."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from common.device import check_device, default_device, default_dtype, parse_dtype

from .attention_backends import resolve_backend


@dataclass
class EngineConfig:
    model: str = "smollm2-135m"      # preset name or local HF directory
    device: str | None = None        # default: cuda when present, else cpu
    dtype: str | None = None         # default: bfloat16 on cuda, float32 on cpu
    max_model_len: int | None = None  # prompt + output tokens; default: the model's max position
    seed: int = 0                    # weights of random presets, and unseeded sampling
    block_size: int | None = None    # tokens per KV block; default 16, 64 for MLA on a GPU (resolve_block_size)
    gpu_memory_utilization: float = 0.9  # share of the GPU memory free after loading for the KV pool
    cpu_kv_cache_bytes: int = 512 << 20  # KV pool size on CPU (no free-memory query there)
    kv_cache_bytes: int | None = None  # KV pool size on any device, overriding both of the above
                                     # (with a draft model: its pool and the target's together)
                                     # (a benchmark sizes it for its workload to share the GPU)
    max_num_seqs: int = 256          # sequences running at once
    max_num_batched_tokens: int = 2048  # tokens in one forward step: decodes first, then prefill
                                     # chunks; a longer prompt is prefilled over several steps
    max_num_partial_prefills: int = 1  # prompts part way through their prefill at once (K); a chunk is
                                     # at most max_num_batched_tokens // K tokens
    tensor_parallel_size: int = 1    # ranks (processes, one device each) that split every layer's
                                     # weights and the KV pool's heads (parallel_layers.py)
    distributed_timeout_s: float = 120.0  # a collective waiting longer ends the engine: a rank died or hangs
    preemption: str = "recompute"    # when a decode step finds no free block: "recompute" (drop the
                                     # KV, re-prefill later) or "swap" (copy it to host memory)
    enable_prefix_caching: bool = True  # keep written KV blocks in a radix tree; a request reads its
                                     # cached prefix instead of computing it (False: no sharing)
    attention_backend: str = "auto"  # "torch" (exact, everywhere), "flash-attn" (FlashAttention 4,
                                     # GPU), "triton" (our kernel); "auto": on a GPU flash-attn when
                                     # importable, else triton (both capture); on CPU torch
    speculative: str | None = None   # who drafts tokens for the target to verify: "ngram" (prompt
                                     # lookup) or "draft" (a self-draft); None (or "none"): off
    num_speculative_tokens: int = 4  # k: tokens drafted per sequence and step
    speculative_disable_by_batch_size: int = 16  # the switch: no drafts in a step that decodes
                                     # more sequences than this (the verify stops being cheap)
    prompt_lookup_max: int = 4       # "ngram": the longest context suffix looked up, in tokens
    prompt_lookup_min: int = 2       # ... and the shortest
    draft_num_layers: int | None = None  # "draft": the target's first layers it keeps (default: half)
    cuda_graph: bool = True          # replay captured decode steps (CUDA with flash-attn or triton;
                                     # elsewhere every step runs eagerly); False: the eager engine
    cuda_graph_max_batch: int = 256  # the largest decode batch captured (capped at max_num_seqs)
    mla_decode: str = "absorbed"     # MLA models (mla.py): "absorbed" (attend over the cached latents,
                                     # W_UK and W_UV folded into the query and output) or "naive"
                                     # (decompress the whole context every step: the ablation)
    fused_kernels: bool = True       # on a GPU, rope + K/V write, add + norm, SiLU * mul as one Triton
                                     # kernel each; False: torch's ops (the ablation: graphs alone)

    def __post_init__(self):
        self.device = check_device(self.device or default_device())
        self.dtype = self.dtype or default_dtype(self.device)
        self.torch_dtype = parse_dtype(self.dtype)
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise ValueError(f"max_model_len must be positive, got {self.max_model_len}")
        if self.block_size is not None and (not isinstance(self.block_size, int) or self.block_size <= 0):
            raise ValueError(f"block_size must be a positive integer, got {self.block_size!r}")
        for name in ("cpu_kv_cache_bytes", "max_num_seqs", "max_num_batched_tokens",
                     "max_num_partial_prefills", "cuda_graph_max_batch"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.kv_cache_bytes is not None and (not isinstance(self.kv_cache_bytes, int) or self.kv_cache_bytes <= 0):
            raise ValueError(f"kv_cache_bytes must be a positive integer or None, got {self.kv_cache_bytes!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                             f"max_num_seqs ({self.max_num_seqs}): a decode step runs one token per sequence")
        self._check_tensor_parallel()
        if self.enable_prefix_caching not in (True, False, 0, 1):
            raise ValueError(f"enable_prefix_caching must be True or False, got {self.enable_prefix_caching!r}")
        self.enable_prefix_caching = bool(self.enable_prefix_caching)
        if self.preemption not in ("recompute", "swap"):
            raise ValueError(f"preemption must be 'recompute' or 'swap', got {self.preemption!r}")
        self.attention_backend = resolve_backend(self.attention_backend, self.device)
        self._check_speculative()
        if self.cuda_graph not in (True, False, 0, 1):
            raise ValueError(f"cuda_graph must be True or False, got {self.cuda_graph!r}")
        self.cuda_graph = bool(self.cuda_graph)
        if self.mla_decode not in ("absorbed", "naive"):
            raise ValueError(f"mla_decode must be 'absorbed' or 'naive', got {self.mla_decode!r}")
        if self.fused_kernels not in (True, False, 0, 1):
            raise ValueError(f"fused_kernels must be True or False, got {self.fused_kernels!r}")
        self.fused_kernels = bool(self.fused_kernels)

    @property
    def graphs_apply(self) -> bool:
        """Does this engine capture graphs? On CUDA with a backend whose decode reads only device
        tensors: the torch reference sizes its gather by a host int, which a graph would freeze."""
        return self.cuda_graph and self.device.startswith("cuda") and self.attention_backend != "torch" \
            and self.mla_decode == "absorbed"     # the naive decode sizes its rebuild by host ints

    def _check_speculative(self) -> None:
        self.speculative = None if self.speculative in (None, "none") else self.speculative
        if self.speculative not in (None, "ngram", "draft"):
            raise ValueError(f"speculative must be 'ngram', 'draft' or None, got {self.speculative!r}")
        for name in ("num_speculative_tokens", "speculative_disable_by_batch_size", "prompt_lookup_min",
                     "prompt_lookup_max", *(["draft_num_layers"] if self.draft_num_layers is not None else [])):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")

    def _check_tensor_parallel(self) -> None:
        size = self.tensor_parallel_size
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"tensor_parallel_size must be a positive integer, got {size!r}")
        if self.device.startswith("cuda") and size > torch.cuda.device_count():
            raise ValueError(f"tensor_parallel_size {size} needs as many GPUs; {torch.cuda.device_count()} visible")
        if isinstance(self.distributed_timeout_s, bool) or not isinstance(self.distributed_timeout_s, (int, float)) \
                or not self.distributed_timeout_s > 0:
            raise ValueError(f"distributed_timeout_s must be a positive number, got {self.distributed_timeout_s!r}")

    def resolve_block_size(self, is_mla: bool) -> int:
        """The block size asked for, else 16; an MLA model on a GPU gets 64 (FlashMLA's page): its
        latent kernel reads 32- or 64-row tiles, and a tile inside one page takes one page id and
        consecutive rows where pages of 16 gather a page id a row (triton_mla: the kernel-tune
        sweep, pages of 16 against 64). The CPU's torch reference does not care: 16 there."""
        if self.block_size is not None:
            return self.block_size
        return 64 if is_mla and self.device.startswith("cuda") else 16

    def resolve_max_model_len(self, model_max_position: int) -> int:
        if self.max_model_len is None:
            return model_max_position
        if self.max_model_len > model_max_position:
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the model's "
                             f"max_position_embeddings {model_max_position}")
        return self.max_model_len
