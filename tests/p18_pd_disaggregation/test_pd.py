"""p18_pd_disaggregation: a prefill instance and a decode instance in two processes (gloo on CPU).

The colocated engine's tokens (prompts off the block size, a prefix hit on P), tiny-mla's latents
moved as latents, requests that end on P, seeded sampling continued on D, aborts at every stage,
P killed or hung (a clear error, no block leaked on D, no process left, the next call served by a
new P), D killed under the server (P goes too), the server streaming a PD request; after every
call, the block accounting of both instances (LLM.check() asks P for its own). Each pair starts
once per module: starting P costs seconds. The real SmolLM2 pair runs once (its tokens, a prefix
hit on P); the K/V moves bit for bit, so the tiny pairs check the rest at milliseconds a step."""
from __future__ import annotations

import asyncio
import importlib
import os
import signal
import threading
import time

import httpx
import pytest

from common import serving_client
from common.sampling import SamplingParams
from phases.p18_pd_disaggregation import LLM
from phases.p18_pd_disaggregation.config import EngineConfig
from tests.suites.served import children
from tests.suites.server import serving

PHASE = "p18_pd_disaggregation"
SMALL = dict(device="cpu", dtype="float32", block_size=4, kv_cache_bytes=1 << 20, max_num_seqs=4,
             distributed_timeout_s=3)
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9], list(range(40, 75)), [3] * 17, list(range(200, 208))]   # 5, 35, 17, 8 tokens


def ids(outputs) -> list[list[int]]:
    return [o.token_ids for o in outputs]


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"     # a zombie has exited
    except FileNotFoundError:
        return True


@pytest.fixture(scope="module")
def solo():
    return LLM("tiny-llama", **SMALL)


@pytest.fixture(scope="module")
def pair():
    llm = LLM("tiny-llama", disaggregation="pd", **SMALL)
    yield llm
    pid = llm.pd.proc.pid
    llm.shutdown()
    assert gone(pid), "the prefill instance outlived shutdown()"


def test_real_model_gives_the_colocated_tokens_with_a_prefix_hit_on_p():
    """SmolLM2, greedy, block size 16: prompts of 9, 21 and 40 tokens (none a block multiple), then
    a prompt sharing the 40-token one's first 32: P reads two cached blocks and computes the rest.
    (The pair of the real checkpoint: its loader, its shapes, its tokens; the tiny pair below covers
    the rest at milliseconds a step.)"""
    opts = dict(device="cpu", dtype="float32", kv_cache_bytes=8 << 20, max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    base = list(range(1000, 1040))
    prompts = [list(range(500, 509)), list(range(700, 721)), base]
    later = [base[:32] + [7, 8, 9, 10, 11]]
    solo = LLM("smollm2-135m", **opts)
    want, want_later = ids(solo.generate(prompts, params)), ids(solo.generate(later, params))
    llm = LLM("smollm2-135m", disaggregation="pd", **opts)
    try:
        assert ids(llm.generate(prompts, params)) == want
        llm.check()
        assert ids(llm.generate(later, params)) == want_later
        assert list(llm.pd.timeline.values())[-1]["cached"] == 32       # two blocks hit on P
        llm.check()
    finally:
        llm.shutdown()


def test_tiny_mla_latents_move_as_latents():
    """An MLA pool row is (latent | rotary key); the transfer is the rows: the colocated tokens.
    (Before the tiny-llama pair starts: one pair a process.)"""
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    want = ids(LLM("tiny-mla", **SMALL).generate(PROMPTS, params))
    llm = LLM("tiny-mla", disaggregation="pd", **SMALL)
    try:
        assert llm.cache.layers[0].shape[0] == 1          # one row a token, no K and V
        assert ids(llm.generate(PROMPTS, params)) == want
        llm.check()
    finally:
        llm.shutdown()


def test_tokens_equal_the_colocated_engine(pair, solo):
    assert ids(pair.generate(PROMPTS, GREEDY)) == ids(solo.generate(PROMPTS, GREEDY))
    pair.check()
    assert all("landed" in pair.pd.timeline[i] for i in list(pair.pd.timeline)[-len(PROMPTS):])


def test_a_prefix_hit_on_p_gives_the_colocated_tokens(pair, solo):
    """A prompt sharing the 35-token one's first 32 (8 blocks) and then going its own way: P reads
    the cached blocks and computes the rest, D gets the whole prompt's K/V."""
    later = [PROMPTS[1][:32] + [7, 8, 9, 10, 11]]
    pair.generate(PROMPTS[1:2], GREEDY)                             # cached on P (if not already)
    assert ids(pair.generate(later, GREEDY)) == ids(solo.generate(later, GREEDY))
    assert list(pair.pd.timeline.values())[-1]["cached"] == 32       # eight blocks hit on P
    pair.check()


def test_seeded_sampling_continues_on_d(pair, solo):
    """P's first draw and D's next ones are one generator's: the colocated engine's tokens."""
    params = SamplingParams(temperature=0.9, top_k=20, seed=3, max_tokens=6, ignore_eos=True)
    assert ids(pair.generate(PROMPTS, params)) == ids(solo.generate(PROMPTS, params))
    pair.check()


def test_max_tokens_1_ends_on_p_and_sends_no_kv(pair, solo):
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    before = dict(pair.pd.timeline)
    out = pair.generate(PROMPTS, params)
    assert ids(out) == ids(solo.generate(PROMPTS, params)) and all(o.finish_reason == "length" for o in out)
    assert pair.pd.timeline == before                       # no transfer was started
    pair.check()


def until_in_transfer(llm) -> None:
    """D's poll, stopped once a first token is read and its receive started (not landed)."""
    d = llm.pd
    while not d.transfers:
        d._wait_message()
        while d.inbox.ready():
            d._read(d.inbox.receive())
        d._reserve()


def test_abort_while_queued_in_transfer_and_decoding(pair, solo):
    """Each stage: abort, then both instances hold no block of it; then a call runs normally."""
    d = pair.pd
    queued = pair.add_request(PROMPTS[1], GREEDY)            # sent to P, not answered yet
    pair.abort_request(queued)
    in_transfer = pair.add_request(PROMPTS[1], GREEDY)
    until_in_transfer(pair)
    assert d.transfers[0][0].seq_id == in_transfer and d.transfers[0][0].block_table
    pair.abort_request(in_transfer)
    decoding = pair.add_request(PROMPTS[2], GREEDY)
    while not pair.scheduler.running:
        pair.step()
    pair.abort_request(decoding)
    assert not pair.has_unfinished()
    pair.check()
    assert ids(pair.generate(PROMPTS, GREEDY)) == ids(solo.generate(PROMPTS, GREEDY))
    pair.check()


def _kill_later(pid: int, delay_s: float) -> None:
    threading.Timer(delay_s, os.kill, (pid, signal.SIGKILL)).start()


def test_p_killed_mid_request_is_named_and_replaced(pair, solo):
    """P stopped (so the request stays on P), then killed during the call: the call fails naming P,
    D holds no block, P is gone; the next call starts a new P and gives the colocated tokens."""
    pid = pair.pd.proc.pid
    os.kill(pid, signal.SIGSTOP)
    _kill_later(pid, 0.3)
    with pytest.raises(RuntimeError, match="prefill instance exited with code -9"):
        pair.generate(PROMPTS, GREEDY)
    assert gone(pid) and not pair.has_unfinished()
    pair.check()                                             # D's accounting (P is gone)
    assert ids(pair.generate(PROMPTS, GREEDY)) == ids(solo.generate(PROMPTS, GREEDY))
    assert pair.pd.proc.pid != pid
    pair.check()


def test_p_hung_past_the_timeout_is_named_and_replaced(pair, solo):
    pid = pair.pd.proc.pid
    os.kill(pid, signal.SIGSTOP)
    with pytest.raises(RuntimeError, match="prefill instance did not answer within 3 s"):
        pair.generate(PROMPTS[:1], GREEDY)
    assert gone(pid)
    pair.check()
    assert ids(pair.generate(PROMPTS[:1], GREEDY)) == ids(solo.generate(PROMPTS[:1], GREEDY))
    pair.check()


def test_a_transfer_that_fails_is_named_and_frees_both_sides(pair, solo, monkeypatch):
    """The link breaks under a request's K/V (D's landing of it raises): the call fails naming
    it, D holds no block, P (and its pool) is replaced; the next call gives the colocated tokens."""
    receive = pair.pd.connector.recv

    def broken(*args):
        transfer = receive(*args)

        def land():
            transfer.wait(pair.pd.timeout_s)         # the bytes arrived; then the copy fails
            raise ConnectionError("a KV transfer broke off")
        transfer.land = land
        return transfer
    monkeypatch.setattr(pair.pd.connector, "recv", broken)
    pid = pair.pd.proc.pid
    with pytest.raises(RuntimeError, match="prefill instance a KV transfer broke off"):
        pair.generate(PROMPTS, GREEDY)
    assert gone(pid) and not pair.has_unfinished()
    pair.check()
    assert ids(pair.generate(PROMPTS, GREEDY)) == ids(solo.generate(PROMPTS, GREEDY))
    pair.check()


def test_bad_disaggregation_options_are_refused():
    with pytest.raises(ValueError, match="disaggregation must be"):
        EngineConfig(model="tiny-llama", device="cpu", disaggregation="dp")
    with pytest.raises(ValueError, match="speculative"):
        EngineConfig(model="tiny-llama", device="cpu", disaggregation="pd", speculative="ngram")


def test_server_streams_a_pd_request_and_d_killed_takes_p_along(solo):
    """HTTP app + D (the engine process) + P (D's child): streamed requests give the colocated
    tokens; D killed mid-stream ends the stream with an error, and P does not outlive it. The app
    runs in a thread here: a server process would add seconds of imports and nothing this checks
    (how it starts and stops around its engine is the served suite's)."""
    module = importlib.import_module(f"phases.{PHASE}")
    engine = module.AsyncLLM("tiny-llama", disaggregation="pd", **SMALL)
    with serving(module, engine) as url:
        requests = [(prompt, GREEDY.max_tokens) for prompt in PROMPTS]
        results, _ = asyncio.run(serving_client.run(url, "tiny-llama", requests))
        assert [r.token_ids for r in results] == ids(solo.generate(PROMPTS, GREEDY))
        [prefill] = children(engine.proc.pid)
        body = {"model": "tiny-llama", "prompt": [5, 6, 7], "max_tokens": 2000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as response:
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data:"))         # streaming from D
            os.kill(engine.proc.pid, signal.SIGKILL)
            rest = "\n".join(lines)
        assert "error" in rest and "exited" in rest
        deadline = time.monotonic() + 10
        while not gone(prefill) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(prefill), "the prefill instance outlived its decode instance"


@pytest.mark.gpu
def test_gpu_pair_moves_kv_by_placement():
    """One GPU: P beside D, the K/V over CUDA IPC (a side stream); two GPUs: P on the second, NCCL.
    The colocated engine's tokens, an abort in transfer, the accounting of both."""
    import torch
    from phases.p18_pd_disaggregation.kv_connector import IpcConnector, SendRecvConnector
    opts = dict(device="cuda", dtype="float32", block_size=4, kv_cache_bytes=1 << 22, max_num_seqs=4)
    want = ids(LLM("tiny-llama", **opts).generate(PROMPTS, GREEDY))
    llm = LLM("tiny-llama", disaggregation="pd", **opts)
    try:
        kind = SendRecvConnector if torch.cuda.device_count() > 1 else IpcConnector
        assert isinstance(llm.pd.connector, kind)
        assert ids(llm.generate(PROMPTS, GREEDY)) == want
        llm.check()
        assert ids(llm.generate(PROMPTS[::-1], GREEDY)) == want[::-1]       # prefix hits on P
        llm.check()
        request = llm.add_request(PROMPTS[1], GREEDY)
        until_in_transfer(llm)
        llm.abort_request(request)
        llm.check()
    finally:
        llm.shutdown()
