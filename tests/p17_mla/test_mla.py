"""p17_mla: multi-head latent attention on CPU (fp32): HF DeepSeek-V2's greedy tokens, the absorbed
decode equal to the naive one under every switch, the latent kernel in Triton's interpreter, what
a rank holds, what a token's cache entry costs."""
from __future__ import annotations

import pytest
import torch

from common.loader import resolve
from common.sampling import SamplingParams
from phases.p17_mla import LLM
from phases.p17_mla.model import Model
from phases.p17_mla.parallel_layers import split
from tests.interpreted import run_interpreted

PHASE = "p17_mla"
BASE = dict(device="cpu", dtype="float32")
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def ids(outputs) -> list[list[int]]:
    return [o.token_ids for o in outputs]


@pytest.mark.parametrize("mla_decode", ["absorbed", "naive"])
def test_tiny_mla_gives_hf_deepseek_v2_greedy_tokens(mla_decode, prompts_for, hf_reference):
    """HF's DeepseekV2ForCausalLM (dense MLPs) with the same weights: every reference prompt, > 512 included."""
    llm = LLM("tiny-mla", mla_decode=mla_decode, **BASE)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    assert ids(llm.generate(prompts_for("tiny-mla"), params)) == hf_reference("tiny-mla")


def test_absorbed_equals_naive_with_prefix_hits_chunks_swap_and_two_ranks():
    """A pool small enough to preempt (swap: the latents go to host memory and back), chunks of 24
    tokens, shared prefixes; the absorbed decode, the naive one and two ranks (heads split, the
    latent cache on both) give the same tokens."""
    options = dict(BASE, max_num_seqs=4, max_num_batched_tokens=24, block_size=4, preemption="swap",
                   max_model_len=96, kv_cache_bytes=1 << 15)
    base = [7, 8, 9, 10] * 6
    prompts = [base + [1, 2, 3], base + [4, 5], list(range(300, 360)), [11, 12] * 10, base]
    absorbed = LLM("tiny-mla", **options)
    expected = ids(absorbed.generate(prompts, GREEDY))
    assert absorbed.scheduler.num_preemptions > 0
    assert ids(absorbed.generate(prompts[::-1], GREEDY)) == expected[::-1]          # after prefix hits
    assert ids(LLM("tiny-mla", mla_decode="naive", **options).generate(prompts, GREEDY)) == expected
    two = LLM("tiny-mla", tensor_parallel_size=2, **options)
    try:
        assert ids(two.generate(prompts, GREEDY)) == expected
    finally:
        two.shutdown()


class Rank:
    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size


def test_a_rank_holds_its_heads_and_the_whole_latent_projection():
    source = resolve("tiny-mla")
    cfg = source.config
    full = Model(cfg).float()
    full.load_weights(source.checkpoint())
    for rank in range(2):
        part = Model(cfg, Rank(rank, 2)).float()
        part.load_weights(source.checkpoint())
        h0, h1 = split(cfg.num_heads, rank, 2)
        whole, mine = full.layers[0].attn, part.layers[0].attn
        kv_b = cfg.qk_nope_head_dim + cfg.v_head_dim
        assert torch.equal(mine.q_proj.weight, whole.q_proj.weight[h0 * cfg.head_dim:h1 * cfg.head_dim])
        assert torch.equal(mine.kv_b_proj.weight, whole.kv_b_proj.weight[h0 * kv_b:h1 * kv_b])
        assert torch.equal(mine.o_proj.weight, whole.o_proj.weight[:, h0 * cfg.v_head_dim:h1 * cfg.v_head_dim])
        assert torch.equal(mine.kv_a_proj_with_mqa.weight, whole.kv_a_proj_with_mqa.weight)     # replicated
        assert part.cfg.kv_lora_rank == cfg.kv_lora_rank and part.cfg.num_heads == cfg.num_heads // 2


def test_a_token_caches_one_latent_and_one_rotary_key():
    """DeepSeek-V2-Lite's attention: 512 + 64 values a token and layer, against 16 heads x (192 + 128)
    with per-head K and V: 8.9x fewer bytes (the pool's own bytes per block agree)."""
    cfg = resolve("mla-lite").config
    per_layer = cfg.kv_bytes_per_token(torch.bfloat16) // cfg.num_layers // 2
    assert per_layer == 576
    materialised = cfg.num_heads * (cfg.head_dim + cfg.v_head_dim)
    assert materialised / per_layer > 8
    llm = LLM("tiny-mla", kv_cache_bytes=1 << 16, **BASE)
    small = resolve("tiny-mla").config
    assert llm.cache.layers[0].shape[1:] == (llm.cache.num_blocks + 1, 16, 1, small.kv_lora_rank + small.qk_rope_head_dim)


INTERPRETED = f"""
import json
import torch
from types import SimpleNamespace
from phases.{PHASE} import LLM
from phases.{PHASE}.mla import latent_decode_reference
from phases.{PHASE}.triton_mla import latent_decode
from phases.{PHASE}.cuda_graph import GraphRunner, buckets_up_to
from common.sampling import SamplingParams
torch.manual_seed(0)
# (launch keywords, split counts): the engine's, then triton_mla's variants (the value split, and it
# with bf16 partials on a 64-row head tile); the interpreter is slow: each case once
CASES = (({{}}, (1, 2, 5)), ({{"value_split": 2}}, (1, 5)),
         ({{"value_split": 2, "head_tile": 64, "partial_dtype": torch.bfloat16}}, (1, 2, 5)))
errs = {{"fp32": [], "bf16": []}}
for H, rank, rope, page in ((4, 32, 8, 4), (16, 64, 16, 16)):
    B, W = 5, rank + rope
    pool = torch.randn(40, page, 1, W, dtype=torch.float64).float()
    table = torch.stack([torch.randperm(40)[:12] for _ in range(B)]).int()
    lens = torch.tensor([1, page - 1, page + 1, 33, 12 * page], dtype=torch.int32)[:B]
    q = torch.randn(B, H, W)
    step = SimpleNamespace(block_tables=table, context_lens=lens, max_context_len=int(lens.max()))
    ref = latent_decode_reference(q.double(), pool.double(), rank, 0.1, step)
    for options, splits in ((o, s) for o, counts in CASES for s in counts):
        got = latent_decode(q, pool, table, lens, rank, 0.1, splits, block_n=16, **options)
        errs["bf16" if "partial_dtype" in options else "fp32"].append((got.double() - ref).abs().max().item())
opts = dict(device="cpu", dtype="float32", block_size=4, kv_cache_bytes=1 << 20, max_num_seqs=4)
prompts = [[5, 6, 7, 8, 9], list(range(40, 75)), [3] * 17]
params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
want = [o.token_ids for o in LLM("tiny-mla", attention_backend="torch", **opts).generate(prompts, params)]
llm = LLM("tiny-mla", attention_backend="triton", **opts)
eager = [o.token_ids for o in llm.generate(prompts, params)]
llm.runner.graphs = GraphRunner(llm.model, llm.cache, llm.runner.backend, buckets_up_to(4),
                                width=-(-llm.max_model_len // llm.cache.block_size),
                                scratch_block=llm.cache.scratch_block, capture=False)
lanes = [o.token_ids for o in llm.generate(prompts, params)]
# pages of 64 (MLA's default on a GPU): every tile inside one page (TILE_IN_PAGE), a prompt over two pages
long = [prompts[0], list(range(40, 140)), prompts[2]]
page64 = dict(opts, block_size=64, kv_cache_bytes=1 << 21)
want64 = [o.token_ids for o in LLM("tiny-mla", attention_backend="torch", **page64).generate(long, params)]
got64 = [o.token_ids for o in LLM("tiny-mla", attention_backend="triton", **page64).generate(long, params)]
print(json.dumps({{"kernel": max(errs["fp32"]), "bf16_partials": max(errs["bf16"]), "eager": eager == want,
                  "lanes": lanes == want, "page64": got64 == want64}}))
"""


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(INTERPRETED)


def test_latent_kernel_matches_the_reference_at_1_to_5_splits(interpreted):
    """Lengths 1, a page -1 / +1, 33, a full table (3 or 12 tiles of 16: more splits than tiles leave
    some empty); 4 heads
    (padded to 16) and 16; a rotary part of 8 (padded). The engine's launch and the value split
    (pairs of programs, each half the value columns) within 1e-4; bf16 partials with the value
    split on a 64-row head tile (one bf16 rounding of the partials: 2e-2, kernel_bench's bf16 bound)."""
    assert interpreted["kernel"] < 1e-4
    assert interpreted["bf16_partials"] < 2e-2


def test_engine_on_the_latent_kernel_gives_the_reference_tokens(interpreted):
    """Eager steps, and the graph runner's padded lanes (its CPU stand-in): the torch reference's tokens."""
    assert interpreted["eager"] and interpreted["lanes"]


def test_pages_of_64_give_the_reference_tokens(interpreted):
    """block_size 64, MLA's default on a GPU (config.resolve_block_size): the kernel reads each tile
    from one page; a 100-token prompt spans two. Same tokens as the torch reference."""
    assert interpreted["page64"]


def test_mla_block_size_defaults():
    """16 unless asked, 64 for an MLA model on a GPU (its kernel's tiles lie in one page)."""
    from phases.p17_mla.config import EngineConfig
    assert EngineConfig(device="cpu").resolve_block_size(is_mla=True) == 16
    assert EngineConfig(device="cpu", block_size=32).resolve_block_size(is_mla=True) == 32
    gpu = EngineConfig.__new__(EngineConfig)          # no GPU here: the rule alone, without __post_init__
    gpu.block_size, gpu.device = None, "cuda"
    assert gpu.resolve_block_size(is_mla=True) == 64
    gpu.block_size = None
    assert gpu.resolve_block_size(is_mla=False) == 16


@pytest.mark.gpu
def test_latent_kernel_in_bf16_on_a_gpu():
    from types import SimpleNamespace
    from phases.p17_mla.mla import latent_decode_reference
    from phases.p17_mla.triton_mla import latent_decode
    torch.manual_seed(0)
    B, H, rank, rope, page = 8, 16, 512, 64, 16
    pool = torch.randn(600, page, 1, rank + rope, device="cuda", dtype=torch.bfloat16)
    table = torch.stack([torch.randperm(600, device="cuda")[:512] for _ in range(B)]).int()
    lens = torch.randint(1, 512 * page, (B,), device="cuda", dtype=torch.int32)
    q = torch.randn(B, H, rank + rope, device="cuda", dtype=torch.bfloat16)
    step = SimpleNamespace(block_tables=table, context_lens=lens, max_context_len=int(lens.max()))
    ref = latent_decode_reference(q.float(), pool.float(), rank, 192 ** -0.5, step)
    variants = ({}, {"value_split": 2}, {"partial_dtype": torch.bfloat16},
                {"value_split": 2, "head_tile": 64, "partial_dtype": torch.bfloat16})   # compiled, not interpreted
    for options, splits in ((o, s) for o in variants for s in (1, 8, 32)):
        got = latent_decode(q, pool, table, lens, rank, 192 ** -0.5, splits, **options)
        assert (got.float() - ref).abs().max().item() < 2e-2, (options, splits)


@pytest.mark.gpu
def test_replayed_latent_decode_equals_eager_bit_for_bit():
    """mla-lite's shape in bf16, graphs on the latent kernel: a batch-1 decode over a 6k context
    replays the eager step's logits exactly (the split count is the capacity's in both)."""
    from tests.graph_replay import replay_matches_eager
    assert replay_matches_eager(LLM("mla-lite", max_model_len=8192, max_num_seqs=4, kv_cache_bytes=1 << 30))
