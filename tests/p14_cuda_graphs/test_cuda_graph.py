"""p14_cuda_graphs: decode steps replayed from CUDA graphs give the eager engine's tokens.

On CPU there are no graphs: GraphRunner(capture=False) runs the very forward a graph records
(static buffers, padded lanes, the scratch block) eagerly, so buckets, padding and buffer filling
are checked here against the eager engine's tokens. On a GPU every bucket's replayed logits must
equal its eager logits bit for bit (same kernels, same inputs), for both GPU backends."""
import importlib
from types import SimpleNamespace

import pytest
import torch

from common.sampling import SamplingParams
from common.spec_decode import Draft
from tests.suites.speculative_decoding import MissAt

PHASE = "p14_cuda_graphs"
phase = importlib.import_module(f"phases.{PHASE}")
cuda_graph = importlib.import_module(f"phases.{PHASE}.cuda_graph")
config = importlib.import_module(f"phases.{PHASE}.config")
GraphRunner, buckets_up_to, pick_bucket = cuda_graph.GraphRunner, cuda_graph.buckets_up_to, cuda_graph.pick_bucket

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away",
           "1, 2, 3, 4, 5,", "Hello"]
GREEDY = SamplingParams(max_tokens=20, temperature=0.0)


def test_buckets_are_small_powers_then_steps_of_16_up_to_the_largest():
    assert buckets_up_to(256) == [1, 2, 4, 8] + list(range(16, 257, 16))
    assert buckets_up_to(1) == [1]
    assert buckets_up_to(20) == [1, 2, 4, 8, 16, 20]          # the largest batch always has one


@pytest.mark.parametrize("n, bucket", [(1, 1), (3, 4), (8, 8), (9, 16), (17, 20), (20, 20), (21, None)])
def test_a_batch_replays_the_smallest_bucket_that_holds_it(n, bucket):
    assert pick_bucket(buckets_up_to(20), n) == bucket


def test_graphs_are_off_on_cpu_and_with_the_torch_backend():
    assert not config.EngineConfig(model="tiny-llama", device="cpu").graphs_apply
    assert config.EngineConfig(model="tiny-llama", device="cpu", cuda_graph=0).cuda_graph is False
    with pytest.raises(ValueError, match="cuda_graph"):
        config.EngineConfig(model="tiny-llama", device="cpu", cuda_graph="maybe")


def test_fused_kernels_switch_reaches_every_fused_module():
    """fused_kernels=False: the model and each norm and MLP take torch's ops (on a GPU: the graphs
    without the fusion, the ablation that splits p14's gain); a bad value is refused by name."""
    llm = phase.LLM("tiny-llama", device="cpu", dtype="float32", max_model_len=64, fused_kernels=False)
    fused = [m.fused for m in llm.model.modules() if hasattr(m, "fused")]
    assert fused and not any(fused)
    assert all(m.fused for m in phase.LLM("tiny-llama", device="cpu", max_model_len=64).model.modules()
               if hasattr(m, "fused"))
    with pytest.raises(ValueError, match="fused_kernels"):
        config.EngineConfig(model="tiny-llama", device="cpu", fused_kernels="yes")


def test_auto_picks_a_backend_that_captures_on_a_gpu(monkeypatch):
    """On a GPU without FlashAttention "auto" is our Triton kernel, not the torch reference: the
    graphs (this phase's idea) still apply. On CPU it stays torch."""
    backends = importlib.import_module(f"phases.{PHASE}.attention_backends")
    for installed, expected in ((True, "flash-attn"), (False, "triton")):
        monkeypatch.setattr(backends, "flash_attn_available", lambda: installed)
        assert backends.resolve_backend("auto", "cuda:0") == expected
    assert backends.resolve_backend("auto", "cpu") == "torch"


@pytest.fixture(scope="module")
def smollm2():
    return phase.LLM("smollm2-135m", device="cpu", max_model_len=192, max_num_seqs=8, max_num_batched_tokens=256)


def static_runner(llm, max_batch=8):
    return GraphRunner(llm.model, llm.cache, llm.runner.backend, buckets_up_to(max_batch),
                       width=-(-llm.max_model_len // llm.cache.block_size), scratch_block=llm.cache.scratch_block,
                       capture=False)


def test_static_buffer_path_gives_the_eager_tokens(smollm2):
    """Five prompts decode in bucket 8 (three padded lanes), then fewer as they finish: the
    padded, statically buffered forward must give the eager engine's greedy tokens."""
    params = [SamplingParams(max_tokens=n, temperature=0.0) for n in (10, 4, 7, 2, 10)]
    eager = [o.token_ids for o in smollm2.generate(PROMPTS, params)]
    smollm2.runner.graphs = static_runner(smollm2)
    try:
        assert [o.token_ids for o in smollm2.generate(PROMPTS, params)] == eager
    finally:
        smollm2.runner.graphs = None


def test_padded_lanes_write_only_the_scratch_block(smollm2):
    """Three sequences decode in bucket 4: the pool changes only in their own blocks and in the
    scratch block (zeroed first: the padded lane's K/V is the same every step)."""
    scratch = smollm2.cache.scratch_block
    for layer in smollm2.cache.layers:
        layer[:, scratch] = 0
    before = [layer.clone() for layer in smollm2.cache.layers]
    owned = set()
    smollm2.runner.graphs = static_runner(smollm2)
    try:
        for p in PROMPTS[:3]:
            smollm2.add_request(p, SamplingParams(max_tokens=4, temperature=0.0))
        while smollm2.has_unfinished():
            smollm2.step()
            owned |= {b for s in smollm2.scheduler.running for b in s.block_table}
    finally:
        smollm2.runner.graphs = None
    touched = {b for layer, old in zip(smollm2.cache.layers, before)
               for b in (layer != old).flatten(2).any(-1).any(0).nonzero().flatten().tolist()}
    assert scratch in touched and scratch not in owned
    assert touched - {scratch} <= owned and owned


@pytest.mark.parametrize("seats, budget, partial", [(1, 1, 1), (3, 3, 1), (2, 6, 4)],
                         ids=["budget-1", "budget-equals-seats", "partial-above-half"])
def test_a_one_token_prompt_chunk_is_no_lane(seats, budget, partial):
    """Steps where a prompt computes one token that is not its last (a budget of 1; one token of
    budget left beside the decodes; chunks of budget // K = 1) have one row per sequence, like a
    decode, but a lane feeds the sequence's last token: they must run eagerly. The graph-path
    engine's tokens equal the eager engine's, and so do the next call's, which read the prefix
    the first one cached (a wrong block there would poison every later hit)."""
    options = dict(device="cpu", dtype="float32", max_model_len=64, max_num_seqs=seats,
                   max_num_batched_tokens=budget, max_num_partial_prefills=partial, block_size=4)
    prompts = [list(range(10 + i, 30 + 2 * i)) for i in range(4)]       # the 4th arrives as 2 decode
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (6, 12, 12, 6)]
    eager = [o.token_ids for o in phase.LLM("tiny-llama", **options).generate(prompts, params)]
    lanes = phase.LLM("tiny-llama", **options)
    lanes.runner.graphs = static_runner(lanes, seats)
    assert [o.token_ids for o in lanes.generate(prompts, params)] == eager
    lanes.runner.graphs = None
    assert [o.token_ids for o in lanes.generate(prompts, params)] == eager
    lanes.check()


def test_a_lane_keeps_no_stale_block_table_columns(smollm2):
    """A long sequence leaves lane 0, a short one takes it: the columns past the short one's
    table are 0 again, not the long one's blocks."""
    runner = static_runner(smollm2)

    class Seq:
        def __init__(self, table, computed):
            self.block_table, self.num_computed_tokens, self.last_token, self.draft_ids = table, computed, 7, []
    runner.fill([Seq([5, 6, 7, 8], 60)])
    assert list(runner.host_rows[0, cuda_graph.TABLE:cuda_graph.TABLE + 5]) == [5, 6, 7, 8, 0]
    runner.fill([Seq([9], 3)])
    row = runner.host_rows[0]
    assert list(row[cuda_graph.TABLE:cuda_graph.TABLE + 5]) == [9, 0, 0, 0, 0]
    assert (row[cuda_graph.POSITION], row[cuda_graph.CONTEXT_LEN], row[cuda_graph.SLOT]) == (2, 3, 9 * 16 + 2)
    runner.fill([Seq([9, 4], 17)])       # the table grew: the new block is appended
    assert list(row[cuda_graph.TABLE:cuda_graph.TABLE + 3]) == [9, 4, 0] and row[cuda_graph.SLOT] == 4 * 16
    runner.fill([Seq([3, 2], 18)])       # another sequence, as long: every column rewritten
    assert list(row[cuda_graph.TABLE:cuda_graph.TABLE + 3]) == [3, 2, 0] and row[cuda_graph.SLOT] == 2 * 16 + 1
    runner.fill([Seq([1], 1), Seq([8], 1)])
    runner.fill([])                       # padding: the scratch block, position 0, length 1
    for lane in (0, 1):
        assert list(runner.host_rows[lane, :cuda_graph.TABLE + 2]) == [0, 0, runner.scratch_block * 16, 1,
                                                                        runner.scratch_block, 0]


def test_a_verify_takes_one_decode_lane_per_row(smollm2):
    """A sequence verifying two drafts: three consecutive lanes, its newest token then the drafts,
    each at its own position, seeing keys up to its own (context = position + 1), through the
    sequence's table. can_run takes decodes and verifies whose every row is scored, nothing else."""
    runner = static_runner(smollm2)
    seq = SimpleNamespace(block_table=[3, 4], num_computed_tokens=20, num_tokens=18, last_token=7, draft_ids=[11, 12])
    plain = SimpleNamespace(block_table=[5], num_computed_tokens=9, num_tokens=9, last_token=8, draft_ids=[])
    assert runner.fill([plain, seq]) == 4
    rows = runner.host_rows[:4]
    assert [list(r[:cuda_graph.TABLE + 3]) for r in rows] == [
        [8, 8, 5 * 16 + 8, 9, 5, 0, 0],
        [7, 17, 4 * 16 + 1, 18, 3, 4, 0], [11, 18, 4 * 16 + 2, 19, 3, 4, 0], [12, 19, 4 * 16 + 3, 20, 3, 4, 0]]
    plan = SimpleNamespace(seqs=[plain, seq], num_new_tokens=[1, 3])
    assert runner.can_run(plan, [1, 3])
    assert not runner.can_run(plan, [1, 1]) and not runner.can_run(plan)   # rows the engine would not get
    chunk = SimpleNamespace(block_table=[6], num_computed_tokens=5, num_tokens=9, last_token=1, draft_ids=[])
    assert not runner.can_run(SimpleNamespace(seqs=[chunk], num_new_tokens=[5]))    # a prompt chunk
    assert not runner.can_run(SimpleNamespace(seqs=[chunk], num_new_tokens=[1]))    # ... of one token, not its last
    many = SimpleNamespace(seqs=[seq] * 3, num_new_tokens=[3] * 3)
    assert not runner.can_run(many, [3] * 3)                                   # 9 rows > bucket 8


def test_verify_steps_through_the_static_buffers_give_the_eager_tokens():
    """Prompt lookup drafts on repetitive prompts: the verify steps run as decode lanes through
    the static buffers and keep exactly the drafts the eager verify keeps (fp32: same tokens)."""
    llm = phase.LLM("smollm2-135m", device="cpu", max_model_len=192, max_num_seqs=8, max_num_batched_tokens=256,
                    speculative="ngram", num_speculative_tokens=3)
    prompts = ["1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3,", "a b c a b c a b c a b", "Hello"]
    params = SamplingParams(max_tokens=16, temperature=0.0)
    eager = [o.token_ids for o in llm.generate(prompts, params)]
    eager_accepted = llm.speculator.num_accepted_tokens
    runner = llm.runner.graphs = static_runner(llm)
    verified = []
    run = runner.run
    runner.run = lambda plan: verified.append(any(s.draft_ids for s in plan.seqs)) or run(plan)
    try:
        assert [o.token_ids for o in llm.generate(prompts, params)] == eager
    finally:
        llm.runner.graphs = None
    assert any(verified) and llm.speculator.num_accepted_tokens == 2 * eager_accepted > 0


# --- GPU: the captured graphs themselves ------------------------------------------------------
def gpu_engine(backend, **options):
    return phase.LLM("llama-1b", device="cuda", attention_backend=backend, detokenize=False, max_model_len=1024,
                     max_num_seqs=32, max_num_batched_tokens=2048, kv_cache_bytes=2 << 30,
                     cuda_graph_max_batch=32, **options)


def backends():
    """Both GPU backends; FlashAttention 4 is an optional install (the GPU runs install it)."""
    no_fa4 = pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="flash-attn-4 is not installed")
    return [pytest.param("triton", marks=pytest.mark.gpu), pytest.param("flash-attn", marks=[pytest.mark.gpu, no_fa4])]


@pytest.mark.parametrize("backend", backends())
def test_replayed_logits_equal_eager_logits_bit_for_bit(backend):
    """Every bucket: fill the static buffers from real decode-ready sequences, replay the graph,
    run the same forward eagerly on the same buffers: identical logits."""
    llm = gpu_engine(backend)
    graphs = llm.runner.graphs
    assert graphs is not None and sorted(graphs.graphs) == graphs.buckets
    for bucket in graphs.buckets:
        n = max(1, bucket - 1)                            # a padded lane where there can be one
        for i in range(n):
            llm.add_request([1 + i] * (17 + 5 * i), SamplingParams(max_tokens=3, temperature=0.0))
        while not llm.scheduler.running or any(s.num_pending_tokens > 1 for s in llm.scheduler.running) \
                or llm.scheduler.waiting:
            llm.step()                                    # prefill until all n decode next
        plan = llm.scheduler.schedule()
        assert not plan.is_prefill and len(plan.seqs) == n
        replayed = graphs.run(plan).clone()
        # the graph's own copy node brought this step's rows from the pinned host buffer
        assert torch.equal(graphs.static[:bucket].cpu(), graphs.host[:bucket]), bucket
        eager = graphs._forward(bucket)[:n]
        assert torch.equal(replayed, eager), bucket
        llm._abort(list(llm.requests.values()))


@pytest.mark.parametrize("backend", backends())
def test_a_replayed_verify_equals_its_eager_lanes_bit_for_bit(backend):
    """Three sequences verifying four drafts each: 15 lanes, replayed = run eagerly on the same
    buffers (bf16, the same kernels)."""
    llm = gpu_engine(backend, speculative="ngram", num_speculative_tokens=4)
    llm.speculator.proposer = SimpleNamespace(propose=lambda seqs, k: [Draft([1, 2, 3, 4][:k]) for _ in seqs],
                                              release=lambda seq: None)
    for i in range(3):
        llm.add_request([3 + i] * (10 + 37 * i), SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    while llm.scheduler.waiting or any(s.num_pending_tokens > 1 for s in llm.scheduler.running):
        llm.step()                                        # prefill until all three decode next
    plan = llm.scheduler.schedule()
    scored, graphs = llm.speculator.draft(plan), llm.runner.graphs
    assert scored == [5, 5, 5] and graphs.can_run(plan, scored)
    replayed = graphs.run(plan).clone()
    assert torch.equal(replayed, graphs._forward(pick_bucket(graphs.buckets, 15))[:15])


@pytest.mark.gpu
def test_verifies_in_the_graphs_keep_the_plain_greedy_tokens():
    """Drafts of the plain graphed engine's own greedy continuation, the third one wrong (k = 4):
    whole generations keep its tokens, drafts accepted and rejected on the way. In float32: in
    bf16 a draft's K/V, computed in a 15-row step, rounds unlike the same token's in a 3-row
    decode, and on random weights two logits can tie that closely (this is not the graphs' doing)."""
    prompts = [[3 + i] * (10 + 37 * i) for i in range(3)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    plain = gpu_engine("triton", dtype="float32")
    truth = {tuple(p): o.token_ids for p, o in zip(prompts, plain.generate(prompts, params))}
    del plain
    llm = gpu_engine("triton", dtype="float32", speculative="ngram", num_speculative_tokens=4)
    llm.speculator.proposer = MissAt(truth, 2, llm.model_config.vocab_size)
    verified = []
    run = llm.runner.graphs.run
    llm.runner.graphs.run = lambda plan: verified.append(any(s.draft_ids for s in plan.seqs)) or run(plan)
    assert [o.token_ids for o in llm.generate(prompts, params)] == list(truth.values())
    assert any(verified) and 0 < llm.speculator.num_accepted_tokens < llm.speculator.num_draft_tokens


@pytest.mark.parametrize("backend", backends())
def test_graph_engine_gives_the_eager_engines_greedy_tokens(backend):
    prompts = [[3 + i] * (10 + 37 * i) for i in range(11)]
    params = [SamplingParams(max_tokens=40 + 3 * i, temperature=0.0, ignore_eos=True) for i in range(11)]
    graphed = gpu_engine(backend)
    assert graphed.graph_stats["graph_memory_bytes"] < 0.5 * 2**30
    got = [o.token_ids for o in graphed.generate(prompts, params)]
    del graphed
    eager = gpu_engine(backend, cuda_graph=False)
    assert eager.runner.graphs is None
    assert [o.token_ids for o in eager.generate(prompts, params)] == got


def test_the_ablation_switch_reaches_the_engine_options():
    cli = importlib.import_module(f"phases.{PHASE}.__main__")
    assert cli.parse_args(["--no-cuda-graph"]).cuda_graph is False
    assert cli.parse_args([]).cuda_graph is True
