"""p15_flash_decoding: the split-K kernel in Triton's interpreter on CPU (one fresh process:
TRITON_INTERPRET=1 must be set before triton is first imported): against a float64 reference at
1 to 8 splits on awkward sizes (lengths 1, a block's size +- 1, not a multiple of the split, more
splits than tiles, mixed lengths, NaN-poisoned outputs), verify lanes (one table, consecutive
lengths), the engine's tokens on our kernel equal to the torch reference's; and the split rule.

The interpreter runs a kernel's programs one after another in Python, one per (sequence, KV head,
split), so its time grows with the KV heads: kernel_bench's checks run here with at most
INTERPRETED_KV_HEADS of them (each check keeps its GQA group, head dim, page size and context
lengths). `make phase-15 kernel` on a GPU runs them as written, the llama shapes' 8 KV heads too."""
import importlib

import pytest

from tests.interpreted import run_interpreted

PHASE = "p15_flash_decoding"
triton_free = importlib.import_module(f"phases.{PHASE}.bench")
INTERPRETED_KV_HEADS = 2        # a KV head past the first still reads its own slice of the pages

INTERPRETED = f"""
import dataclasses
import json
import torch
from phases.{PHASE} import LLM, kernel_bench
from phases.{PHASE}.triton_decode import paged_decode
from common.sampling import SamplingParams
from tests.reference import prompts_for
torch.manual_seed(0)
kernel_bench.CHECKS = [(B, heads // kv * min(kv, {INTERPRETED_KV_HEADS}), min(kv, {INTERPRETED_KV_HEADS}), d, page, lens)
                       for B, heads, kv, d, page, lens in kernel_bench.CHECKS]
out = {{"kernel": all(c["ok"] for c in kernel_bench.check("cpu", torch.float32))}}
# verify lanes: one sequence's k + 1 rows share its table, lane j sees keys [0, s + j]
B, H, KV, D, page = 5, 8, 2, 32, 4
q = torch.randn(B, H, D)
kp, vp = torch.randn(40, page, KV, D), torch.randn(40, page, KV, D)
table = torch.randperm(40)[:12].int().repeat(B, 1)
lens = torch.arange(30, 30 + B, dtype=torch.int32)
errs = []
for splits in (1, 2, 5):
    got = paged_decode(q, kp, vp, table, lens, splits, block_n=16, out=torch.full_like(q, float("nan")))
    ref = kernel_bench.reference(q, kp, vp, [table[0].tolist()] * B, lens.tolist())
    errs.append((got.double() - ref).abs().max().item())
out["lanes"] = max(errs)
# the tuned launch shapes (launch_config: 128-key tiles at head dim 64 and one split, 64 otherwise),
# not the 16-key tiles the checks use: contexts ending inside a tile and past one
tuned = []
for D, splits in ((64, 1), (64, 3), (128, 1), (128, 3)):
    case = kernel_bench.random_case(3, 8, 2, D, 16, [1, 130, 255], "cpu", torch.float32)
    qq, kk, vv, tables, tt, ll = case
    got = paged_decode(qq, kk, vv, tt, ll, splits, out=torch.full_like(qq, float("nan")))
    tuned.append((got.double() - kernel_bench.reference(qq, kk, vv, tables, ll.tolist())).abs().max().item())
out["tuned_launch"] = max(tuned)
opts = dict(device="cpu", dtype="float32", block_size=4, cpu_kv_cache_bytes=1 << 20)
params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
          SamplingParams(temperature=0.8, top_p=0.9, max_tokens=16, seed=5, ignore_eos=True)]
prompts = prompts_for("tiny-llama")[:2]
runs = [[o.token_ids for o in LLM("tiny-llama", attention_backend=b, **opts).generate(prompts, params)]
        for b in ("triton", "torch")]
out["engine"] = runs[0] == runs[1]
# the graph path's stand-in: static buffers, padded lanes, S chosen for the table's capacity;
# 8 tokens a request (every decode step of it pads its lanes and splits alike), held to the torch
# run's first 8 (a request's greedy or seeded tokens do not depend on how many follow them)
from phases.{PHASE}.cuda_graph import GraphRunner, buckets_up_to
short = [dataclasses.replace(p, max_tokens=8) for p in params]
want = [ids[:8] for ids in runs[1]]
llm = LLM("tiny-llama", attention_backend="triton", max_num_seqs=4, **opts)
llm.runner.graphs = GraphRunner(llm.model, llm.cache, llm.runner.backend, buckets_up_to(4),
                                width=-(-llm.max_model_len // llm.cache.block_size),
                                scratch_block=llm.cache.scratch_block, capture=False)
out["lanes_engine"] = [o.token_ids for o in llm.generate(prompts, short)] == want
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(INTERPRETED)


def test_kernel_matches_the_reference_at_every_split_count(interpreted):
    assert interpreted["kernel"] is True


def test_verify_lanes_read_their_own_lengths(interpreted):
    assert interpreted["lanes"] < 1e-4


def test_engine_on_the_split_kernel_gives_the_reference_tokens(interpreted):
    """tiny-llama, two reference prompts (9 and 32 tokens), one request greedy and one seeded."""
    assert interpreted["engine"] is True


def test_graph_lanes_on_the_split_kernel_give_the_reference_tokens(interpreted):
    """The CPU stand-in of the graph runner (its static buffers and padded lanes, eagerly): the
    split count comes from the table's capacity (max_model_len), most splits empty."""
    assert interpreted["lanes_engine"] is True


def test_the_tuned_launch_shapes_give_the_reference(interpreted):
    """paged_decode at its default launch (launch_config: 128-key tiles at head dim 64 and one
    split) over contexts of 1, 130 and 255 keys, head dims 64 and 128, 1 and 3 splits."""
    assert interpreted["tuned_launch"] < 1e-4


def test_split_rule_fills_the_gpu_and_never_splits_a_full_batch():
    """llama-8b (8 KV heads, head dim 128) on 132 SMs: batch 1 at 32k -> 64 splits (512 programs,
    4 waves); 4k -> 16 (no split under 4 tiles); 128 keys -> 1; batch 64 already fills the SMs -> 1.
    llama-1b (head dim 64: half the bytes a program loads, so 8 waves): batch 1 at 32k -> 128."""
    choose = importlib.import_module("phases.p15_flash_decoding.triton_decode").choose_num_splits
    assert [choose(1, 8, 132, n) for n in (32768, 4096, 1024, 128)] == [64, 16, 4, 1]
    assert choose(64, 8, 132, 32768) == 1 and choose(8, 8, 132, 32768) == 9
    assert [choose(1, 8, 132, n, head_dim=64) for n in (131072, 32768, 4096)] == [128, 128, 16]
    assert choose(64, 8, 132, 32768, head_dim=64) == 1


def test_parts_compare_the_previous_kernel_built_twice_on_long_contexts():
    for name in ("long", "long-8b", "latency", "latency-8b", "concurrency", "offline"):
        for run in triton_free.GPU_PARTS[name]:
            engines = run[run.index("--engines") + 1].split(",")
            assert engines == ["p14 attention_backend=triton", "p14#2 attention_backend=triton",
                               "p15 attention_backend=triton"], name
    long_8b = triton_free.GPU_PARTS["long-8b"]
    assert [run[run.index("--prompt-len") + 1] for run in long_8b] == ["32768", "16384", "4096"]   # headline first
    assert all(run[run.index("--engine-options") + 1].startswith("kv_cache_bytes=") for run in long_8b)


# --- on a GPU -------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("batch, context, preset_dim", [(1, 32768, 128), (1, 4096, 64), (4, 16384, 128),
                                                        (64, 4096, 128), (1, 129, 128)])
def test_split_equals_one_split_in_bf16_on_the_gpu(batch, context, preset_dim):
    """The chosen split count against one split (the previous phase's kernel) and the float64
    reference, bf16 inputs, both head shapes: within bf16's tolerance."""
    import torch
    kernel_bench = importlib.import_module(f"phases.{PHASE}.kernel_bench")
    decode = importlib.import_module(f"phases.{PHASE}.triton_decode")
    torch.manual_seed(0)
    case = kernel_bench.random_case(batch, 32, 8, preset_dim, 16, [context] * batch, "cuda", torch.bfloat16)
    q, k_pages, v_pages, tables, table, lens = case
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = decode.choose_num_splits(batch, 8, sms, context, preset_dim)
    split = decode.paged_decode(q, k_pages, v_pages, table, lens, splits)
    one = decode.paged_decode(q, k_pages, v_pages, table, lens, 1)
    rows = list(range(min(batch, 2)))
    ref = kernel_bench.reference(q[rows], k_pages, v_pages, [tables[r] for r in rows], [context] * len(rows))
    assert (split[rows].double() - ref).abs().max().item() < 2e-2
    assert (split.float() - one.float()).abs().max().item() < 2e-2


@pytest.mark.gpu
def test_replayed_split_decode_equals_eager_bit_for_bit():
    """llama-1b shape, graphs on our kernel: a batch-1 decode over a long context replays the eager
    step's logits exactly (the split count is the capacity's in both)."""
    from tests.graph_replay import replay_matches_eager
    LLM = importlib.import_module(f"phases.{PHASE}").LLM  # noqa: N806
    assert replay_matches_eager(LLM("llama-1b", attention_backend="triton", max_model_len=8192, max_num_seqs=4,
                                    kv_cache_bytes=2 << 30))


@pytest.mark.gpu
def test_greedy_tokens_equal_the_previous_phase_in_fp32_on_the_gpu():
    from common.sampling import SamplingParams
    from tests.reference import prompts_for
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = prompts_for("tiny-llama")
    runs = [[o.token_ids for o in importlib.import_module(f"phases.{p}").LLM(
        "tiny-llama", device="cuda", dtype="float32", attention_backend="triton").generate(prompts, params)]
        for p in ("p14_cuda_graphs", PHASE)]
    assert runs[0] == runs[1]
