"""Tensor parallelism on CPU (gloo, float32): ranks split the model and give TP=1's tokens.

Every engine here starts real rank processes; a process holds one process group at a time, so
the module's engines are built one after another and each is shut down before the next (the
Ctrl-C test's engine serves the killed-rank test too, which ends it)."""
from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from common import serving_client
from common.loader import resolve
from common.sampling import SamplingParams
from phases.p16_tensor_parallel import LLM
from phases.p16_tensor_parallel.model import Model
from phases.p16_tensor_parallel.parallel_layers import check_shardable, split
from tests.reference import REF_NEW_TOKENS, ROOT
from tests.suites.served import children
from tests.suites.server import serving

PHASE = "p16_tensor_parallel"
BASE = dict(device="cpu", dtype="float32")
GREEDY = SamplingParams(temperature=0, max_tokens=REF_NEW_TOKENS, ignore_eos=True)


class Rank:
    """What Model reads of its process groups while it is built and loaded (no collective runs)."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size


def ids(outputs) -> list[list[int]]:
    return [o.token_ids for o in outputs]


# --- sharding, in this process -----------------------------------------------------------------
@pytest.mark.parametrize("preset,size", [("tiny-llama", 2), ("tiny-qwen2", 2), ("tiny-llama", 4)])
def test_each_rank_loads_its_slices_of_the_full_weights(preset, size):
    """Rank r's parameters are the full model's slices (q/k/v and gate/up rows, o and down
    columns, vocabulary rows); with 4 ranks over 2 KV heads each KV head is held by two ranks."""
    source = resolve(preset)
    full = Model(source.config).float()
    full.load_weights(source.checkpoint())
    cfg, hd = source.config, source.config.head_dim
    for rank in range(size):
        part = Model(cfg, Rank(rank, size)).float()
        part.load_weights(source.checkpoint())
        q0, q1 = (h * hd for h in split(cfg.num_heads, rank, size))
        kv_head = rank // (size // cfg.num_kv_heads) if size > cfg.num_kv_heads else None
        k0, k1 = (kv_head * hd, (kv_head + 1) * hd) if kv_head is not None else \
            tuple(h * hd for h in split(cfg.num_kv_heads, rank, size))
        f0, f1 = split(cfg.intermediate_size, rank, size)
        v0, v1 = split(cfg.vocab_size, rank, size)
        q_size, kv_size = cfg.num_heads * hd, cfg.num_kv_heads * hd
        whole, mine = full.layers[1], part.layers[1]
        qkv = whole.attn.qkv_proj.weight
        expected_qkv = torch.cat([qkv[q0:q1], qkv[q_size + k0:q_size + k1], qkv[q_size + kv_size + k0:q_size + kv_size + k1]])
        assert torch.equal(mine.attn.qkv_proj.weight, expected_qkv)
        if cfg.qkv_bias:
            bias = whole.attn.qkv_proj.bias
            assert torch.equal(mine.attn.qkv_proj.bias, torch.cat([bias[q0:q1], bias[q_size + k0:q_size + k1],
                                                                   bias[q_size + kv_size + k0:q_size + kv_size + k1]]))
        assert torch.equal(mine.attn.o_proj.weight, whole.attn.o_proj.weight[:, q0:q1])
        gate_up, f = whole.mlp.gate_up_proj.weight, cfg.intermediate_size
        assert torch.equal(mine.mlp.gate_up_proj.weight, torch.cat([gate_up[f0:f1], gate_up[f + f0:f + f1]]))
        assert torch.equal(mine.mlp.down_proj.weight, whole.mlp.down_proj.weight[:, f0:f1])
        assert torch.equal(part.embed.weight[:v1 - v0], full.embed.weight[v0:v1])
        assert torch.equal(part.lm_head.weight[:v1 - v0], full.lm_head.weight[v0:v1])
        assert torch.equal(mine.attn_norm.weight, whole.attn_norm.weight)         # replicated


def test_the_real_checkpoint_is_read_slice_by_slice():
    """A rank reads only its rows of a safetensors tensor: the same numbers as the whole one's."""
    checkpoint, name = resolve("smollm2-135m").checkpoint(), "layers.0.mlp.down_proj.weight"
    whole = checkpoint.read(name, [], "cpu", torch.float32)
    assert torch.equal(checkpoint.read(name, [(1, 512, 1024)], "cpu", torch.float32), whole[:, 512:1024])
    assert torch.equal(checkpoint.read(name, [(0, 0, 8), (0, 100, 108)], "cpu", torch.float32),
                       torch.cat([whole[:8], whole[100:108]]))


def test_a_degree_the_heads_do_not_split_into_is_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match="must divide num_attention_heads"):
        check_shardable(resolve("smollm2-135m").config, 2)             # 9 heads
    with pytest.raises(ValueError, match="must divide num_attention_heads"):
        LLM("tiny-llama", tensor_parallel_size=3, **BASE)               # 4 heads
    with pytest.raises(ValueError, match="tensor_parallel_size must be a positive integer"):
        LLM("tiny-llama", tensor_parallel_size=0, **BASE)


# --- ranks on gloo -----------------------------------------------------------------------------
def test_two_ranks_with_every_switch_give_one_rank_tokens():
    """Prefix hits, chunks, preemption by swap (each rank saves its own heads' K/V), n-gram drafts,
    seeded sampling: TP=1's tokens, with as many blocks a rank (a rank's pool holds half the
    heads: half the bytes buy as many blocks). HF's tokens: the Ctrl-C test below."""
    options = dict(BASE, max_num_seqs=4, max_num_batched_tokens=24, block_size=4, preemption="swap",
                   speculative="ngram", num_speculative_tokens=3, max_model_len=96)
    base = [7, 8, 9, 10] * 6
    prompts = [base + [1, 2, 3], base + [4, 5], list(range(300, 360)), [11, 12] * 10, base]
    params = [GREEDY, SamplingParams(max_tokens=20, temperature=0.9, seed=3, ignore_eos=True),
              GREEDY, SamplingParams(max_tokens=24, temperature=0.7, top_k=20, seed=5, ignore_eos=True), GREEDY]
    one = LLM("tiny-llama", kv_cache_bytes=1 << 16, **options)
    expected = [ids(one.generate(prompts, params)), ids(one.generate(prompts[::-1], params[::-1]))]
    two = LLM("tiny-llama", tensor_parallel_size=2, kv_cache_bytes=1 << 15, **options)
    try:
        assert two.cache.num_blocks == one.cache.num_blocks
        assert ids(two.generate(prompts, params)) == expected[0]
        assert ids(two.generate(prompts[::-1], params[::-1])) == expected[1]     # after prefix hits
        assert two.scheduler.num_preemptions > 0
        two.check()
    finally:
        two.shutdown()


def test_sampled_drafts_of_a_draft_model_agree_across_ranks():
    """A self-draft's sampled drafts are rank 0's (only its generators follow the verify)."""
    options = dict(BASE, kv_cache_bytes=1 << 22, speculative="draft", draft_num_layers=1, num_speculative_tokens=3)
    prompts = [[5, 6, 7, 8, 9], list(range(40, 70))]
    params = [SamplingParams(max_tokens=16, temperature=0.8, seed=i, ignore_eos=True) for i in range(2)]
    expected = ids(LLM("tiny-qwen2", **options).generate(prompts, params))
    two = LLM("tiny-qwen2", tensor_parallel_size=2, **options)
    try:
        assert ids(two.generate(prompts, params)) == expected
    finally:
        two.shutdown()


def test_three_ranks_of_the_real_model_give_hf_greedy_tokens(real_prompts, hf_reference):
    """SmolLM2: 9 heads and 3 KV heads, one KV head a rank; HF's first 16 greedy ids of every
    reference prompt (> 512 tokens included), as the correctness suite's smoke holds each phase."""
    llm = LLM("smollm2-135m", tensor_parallel_size=3, kv_cache_bytes=32 << 20, **BASE)
    try:
        first = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
        assert ids(llm.generate(real_prompts, first)) == [ref[:16] for ref in hf_reference("smollm2-135m")]
    finally:
        llm.shutdown()


def test_generate_on_a_following_rank_is_refused():
    from phases.p16_tensor_parallel.engine import LLM as Engine
    follower = Engine.__new__(Engine)
    follower.tp = Rank(1, 2)
    follower.tp.check, follower.tp.driver = (lambda: None), False
    with pytest.raises(RuntimeError, match="rank 1 follows rank 0"):
        follower.generate([[1, 2, 3]])


# --- faults: rank 0 killed, Ctrl-C, a rank killed, a rank hung ---------------------------------
def rank_pids(llm) -> list[int]:
    return [proc.pid for proc in llm.tp.procs]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:          # a zombie is gone too (its parent has not reaped it)
        return f.read().split()[2] == "Z"


def hold_an_engine(pids) -> None:
    """Rank 0 of a two-rank engine until it is killed: sends its ranks' pids, then waits."""
    llm = LLM("tiny-llama", tensor_parallel_size=2, device="cpu", kv_cache_bytes=1 << 20)
    pids.send(rank_pids(llm))
    time.sleep(600)


def test_ranks_die_with_rank_0():
    """Rank 0 SIGKILLed (no clean-up runs): the ranks it started exit too. Rank 0 is forked from
    this process, which has imported everything already (a new interpreter spends seconds on it);
    it runs before the module's engine starts, whose process group a child would inherit."""
    fork = multiprocessing.get_context("fork")
    receive, send = fork.Pipe(duplex=False)
    rank0 = fork.Process(target=hold_an_engine, args=(send,), daemon=True)
    rank0.start()
    try:
        while not receive.poll(0.1):
            assert rank0.is_alive(), f"rank 0 exited with code {rank0.exitcode} before its ranks started"
        pids = receive.recv()
        assert len(pids) == 1
    finally:
        rank0.kill()
        rank0.join()
    deadline = time.monotonic() + 20
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(gone(pid) for pid in pids)


@pytest.fixture(scope="module")
def tp2():
    """Two ranks of tiny-llama, started once for the Ctrl-C test and then the killed-rank test,
    which ends them (a rank's start costs seconds of imports)."""
    llm = LLM("tiny-llama", tensor_parallel_size=2, kv_cache_bytes=1 << 22, **BASE)
    yield llm
    llm.shutdown()


def interrupt_at_step(llm, monkeypatch, step: int) -> None:
    """A real SIGINT to this process from inside the `step`-th forward, between collectives:
    the moment a Ctrl-C could cut a step in half, reached without waiting on a clock."""
    forward, steps = llm.runner.run, itertools.count(1)

    def run(*args):
        if next(steps) == step:
            os.kill(os.getpid(), signal.SIGINT)
        return forward(*args)
    monkeypatch.setattr(llm.runner, "run", run)


def test_ctrl_c_lands_between_steps_and_the_next_call_is_right(tp2, prompts_for, hf_reference, monkeypatch):
    """A real SIGINT in the middle of generate(): held to the step's end (a collective is never
    cut in half), raised, the call's requests dropped on every rank; the next call is exact."""
    prompts = prompts_for("tiny-llama")
    interrupt_at_step(tp2, monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        tp2.generate(prompts, SamplingParams(max_tokens=400, ignore_eos=True))
    monkeypatch.undo()
    assert not tp2.has_unfinished()
    assert ids(tp2.generate(prompts, GREEDY)) == hf_reference("tiny-llama")
    tp2.check()


@pytest.mark.parametrize("fault", ["killed", "hung"])
def test_a_rank_that_dies_or_hangs_ends_the_engine_with_a_clear_error(fault, request):
    """killed: the module's engine (a dead rank's socket fails the collective at once, whatever the
    timeout); hung: an engine of its own, whose collectives time out after 3 s."""
    if fault == "killed":
        llm = request.getfixturevalue("tp2")
    else:
        llm = LLM("tiny-llama", tensor_parallel_size=2, kv_cache_bytes=1 << 22, distributed_timeout_s=3, **BASE)
    [pid] = rank_pids(llm)
    try:
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4))            # it works first
        os.kill(pid, signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="tensor-parallel engine is unusable") as error:
            llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4))
        assert time.monotonic() - start < 30
        assert ("rank 1 exited with code -9" if fault == "killed" else "did not answer within 3 s") in str(error.value)
        with pytest.raises(RuntimeError, match="unusable"):               # and stays so
            llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4))
        assert gone(pid)                                                   # no rank left behind
    finally:
        llm.shutdown()
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


# --- torchrun ------------------------------------------------------------------------------------
def test_torchrun_launches_the_cli_and_rank_0_answers():
    """torchrun starts both ranks (RANK, WORLD_SIZE, MASTER_ADDR, ... set by it); rank 0 prints the
    answer, rank 1 follows and prints nothing; the tokens are one rank's."""
    prompt = "Once upon a time"
    args = ["--model", "tiny-llama", "--device", "cpu", "--prompt", prompt, "--max-tokens", "12"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                          str(free_port()), "-m", f"phases.{PHASE}", *args, "--tensor-parallel-size", "2"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-2000:]
    answer = LLM("tiny-llama", **BASE).generate(prompt, SamplingParams(temperature=0, max_tokens=12))[0].text
    assert answer and two.stdout.startswith(answer + "\n\n[")          # the answer, a blank line, the report
    assert two.stdout.count("tokens in") == 1                  # one rank reported


def free_port() -> int:
    from phases.p16_tensor_parallel.parallel_state import free_port as port
    return port()


# --- the served path ----------------------------------------------------------------------------
def test_the_server_runs_a_tensor_parallel_engine():
    """`make phase-16 serve --tensor-parallel-size 2`: the engine process starts rank 1; streamed
    completions give the offline tokens; shutting the engine down leaves no rank behind. The HTTP
    app runs in a thread here: a server process would add seconds of imports and nothing this
    checks (how it starts and stops around its engine is the served suite's)."""
    import phases.p16_tensor_parallel as module
    prompts = [[5, 6, 7, 8], list(range(100, 130))]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    expected = ids(LLM("tiny-llama", kv_cache_bytes=1 << 22, **BASE).generate(prompts, params))
    engine = module.AsyncLLM("tiny-llama", tensor_parallel_size=2, kv_cache_bytes=1 << 21, **BASE)
    with serving(module, engine) as url:
        # the engine process's own children, not every rank on the machine: other runs may hold some
        [rank1] = [pid for pid, cmd in children(engine.proc.pid).items() if f"phases.{PHASE}.rank".encode() in cmd]
        results, _ = asyncio.run(serving_client.run(url, "tiny-llama", [(prompt, 10) for prompt in prompts]))
        assert [r.token_ids for r in results] == expected
    deadline = time.monotonic() + 20
    while not gone(rank1) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(rank1)


# --- GPU ----------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "flash-attn"])
def test_one_rank_replays_p15_tokens_on_a_gpu(backend):
    """TP = 1 through the new layer, graphs captured: p15's tokens bit for bit (bf16, llama shapes)."""
    if backend == "flash-attn":
        pytest.importorskip("flash_attn.cute")
    from phases.p15_flash_decoding import LLM as P15
    prompts = [list(range(1000, 1000 + n)) for n in (7, 300, 1500)]
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    options = dict(device="cuda", dtype="bfloat16", kv_cache_bytes=1 << 30, attention_backend=backend)
    expected = ids(P15("llama-1b", **options).generate(prompts, params))
    assert ids(LLM("llama-1b", **options).generate(prompts, params)) == expected
