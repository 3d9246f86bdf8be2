"""The OpenAI-compatible server (phase 09 on), a real uvicorn on 127.0.0.1 over tiny-llama (fp32,
CPU), driven by httpx and by the official openai client. tiny-llama has SmolLM2's tokenizer and
chat template and random weights: what the server does never depends on the weights, and its step
costs milliseconds where SmolLM2's costs ~0.1 s on a CPU thread (the correctness, chat and CLI
suites run the real model).

Replies are checked against the offline engine (LLM.generate) on the same token ids; every
bad-input case gets its status and OpenAI's error shape; clients that go away have their requests
aborted and their KV blocks freed; the server keeps serving after all of it.
"""
from __future__ import annotations

import asyncio
import importlib
import json
import multiprocessing
import os
import re
import signal
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import openai
import pytest
import uvicorn

from common.sampling import SamplingParams

MODEL = "tiny-llama"
OPTIONS = {"device": "cpu", "dtype": "float32", "cpu_kv_cache_bytes": 64 << 20}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(module, engine, model: str = MODEL):
    """The base url of uvicorn serving `engine` in a thread of this process."""
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(module.build_app(engine, model), host="127.0.0.1", port=port,
                                        log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
        engine.shutdown()


@pytest.fixture(scope="module")
def server(phase):
    """(base url, AsyncLLM): uvicorn in a thread of this process, the engine in its own process."""
    module = importlib.import_module(f"phases.{phase}")
    engine = module.AsyncLLM(MODEL, **OPTIONS)
    with serving(module, engine) as url:
        yield url, engine


@pytest.fixture(scope="module")
def offline(LLM):  # noqa: N803 - the phase's engine class (tests/conftest.py)
    return LLM(MODEL, **OPTIONS)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0)


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kw)


def metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    return {m[1]: float(m[2]) for m in re.finditer(r"^mini_infer:(\w+) ([\d.e+-]+)$", text, re.M)}


def wait_pool_full(url: str, engine, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(url)
        if m["kv_blocks_free"] == engine.limits["num_blocks"] and m["num_requests_running"] == 0 \
                and m["num_requests_waiting"] == 0:
            return m
        assert time.monotonic() < deadline, f"the pool did not empty: {m}"
        time.sleep(0.1)


# --- the endpoints, through the openai client -----------------------------------------------------
def test_models_and_health(server, client):
    url, engine = server
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(url + "/health").json() == {"status": "ok"}


def test_completion_equals_offline_engine(client, offline):
    prompt = "The capital of France is"
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    [want] = offline.generate([prompt], greedy(12))
    assert reply.choices[0].text == want.text
    assert reply.choices[0].finish_reason == ("length" if want.finish_reason == "length" else "stop")
    assert reply.usage.completion_tokens == len(want.token_ids)
    assert reply.usage.prompt_tokens == len(want.prompt_token_ids)


def test_streamed_completion_equals_whole_one(client):
    kw = dict(model=MODEL, prompt=[504, 3458, 282, 4649, 314], max_tokens=16, temperature=0)
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    token_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in token_chunks) == whole.choices[0].text
    assert len(token_chunks) == 16                       # one chunk per token
    assert token_chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 16 and not chunks[-1].choices


def test_chat_streamed_and_not_equal_offline(client, offline):
    messages = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name a color."}]
    [want] = offline.generate([offline.tokenizer.messages_ids(messages)], greedy(20))
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0)
    assert whole.choices[0].message.content == want.text and whole.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text


def test_stop_string_never_streamed(client, offline):
    """The stop string: a word from the middle of the greedy reply."""
    prompt = "The capital of France is"
    words = offline.generate([prompt], greedy(24, ignore_eos=True))[0].text.split()
    stop = [words[len(words) // 2]]
    [want] = offline.generate([prompt], greedy(24, stop=stop))
    assert want.finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=stop, stream=True))
    assert streamed == want.text and stop[0] not in streamed


def test_n_choices_and_batched_prompts(client, offline):
    reply = client.completions.create(model=MODEL, prompt=["Hello", "One, two,"], max_tokens=6, temperature=0, n=2)
    wants = offline.generate(["Hello", "One, two,"], greedy(6))
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert [c.text for c in reply.choices] == [wants[0].text, wants[0].text, wants[1].text, wants[1].text]
    seeded = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=1.0, seed=7, n=2)
    again = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=1.0, seed=7, n=2)
    assert [c.text for c in seeded.choices] == [c.text for c in again.choices]


def test_sixteen_concurrent_clients_equal_offline(server, offline):
    url, _ = server
    prompts = [[100 + 7 * i + j for j in range(5 + i)] for i in range(16)]
    wants = offline.generate(prompts, greedy(10, ignore_eos=True))

    async def run():
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as c:
            return await asyncio.gather(*[c.completions.create(model=MODEL, prompt=p, max_tokens=10, temperature=0,
                                                               extra_body={"ignore_eos": True}) for p in prompts])
    replies = asyncio.run(run())
    assert [r.choices[0].text for r in replies] == [w.text for w in wants]


# --- bad input: the right status, OpenAI's shape, and the server serves on ------------------------
def post(url: str, body, path: str = "/v1/completions", **kw) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(url + path, content=content, headers={"content-type": "application/json"}, **{"timeout": 60} | kw)


def assert_error(r: httpx.Response, status: int, param=None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err


@pytest.mark.parametrize("body, param", [
    ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "temperature": -1}, "temperature"),
    ({"model": MODEL, "prompt": "hi", "top_p": 2}, "top_p"),
    ({"model": MODEL, "prompt": "hi", "top_k": -5}, "top_k"),
    ({"model": MODEL, "prompt": "hi", "stop": [""]}, "stop"),
    ({"model": MODEL, "prompt": "hi", "seed": "x"}, "seed"),
    ({"model": MODEL, "prompt": "hi", "n": 0}, "n"),
    ({"model": MODEL, "prompt": "hi", "stream": "yes"}, "stream"),
    ({"model": MODEL, "prompt": "hi", "logprobs": 5}, "logprobs"),
    ({"model": MODEL, "prompt": ""}, "prompt"),
    ({"model": MODEL, "prompt": 42}, "prompt"),
    ({"model": MODEL, "prompt": [1, "a"]}, "prompt"),
    ({"model": MODEL, "prompt": [10**9]}, "prompt"),                 # past the vocab (the engine says so)
    ({"model": MODEL, "prompt": [1] * 9000}, "prompt"),              # over the context
    ({"prompt": "hi"}, "model"),
    ({"model": MODEL, "prompt": "hi", "priority": "high"}, "priority"),
    ({"model": MODEL, "prompt": "hi", "priority": 1.5}, "priority"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "priority": True}, "priority"),
])
def test_bad_parameters_are_400(server, body, param):
    assert_error(post(server[0], body, "/v1/chat/completions" if "messages" in body else "/v1/completions"), 400, param)


def test_bad_chat_messages_are_400(server):
    for messages in ([], [{"role": "robot", "content": "x"}], [{"role": "user", "content": 5}], "hi"):
        assert_error(post(server[0], {"model": MODEL, "messages": messages}, "/v1/chat/completions"), 400, "messages")


def test_malformed_json_unknown_model_route_and_oversized_body(server):
    url, _ = server
    assert_error(post(url, b'{"model": "smollm2-135m", "prompt": '), 400)
    assert_error(post(url, b"\xff\xfe"), 400)
    assert_error(post(url, [1, 2]), 400)
    assert_error(post(url, {"model": "gpt-4", "prompt": "hi"}), 404, "model")
    assert_error(httpx.get(url + "/v1/nothing"), 404)
    assert_error(post(url, {"model": MODEL, "prompt": "x" * (5 << 20)}), 413)


def test_hostile_bodies_are_4xx_json_and_the_connection_serves_on(server, monkeypatch):
    """A lone surrogate (valid JSON, not Unicode), JSON nested 100,000 deep (even in a field the
    server ignores), a text/plain body, a handler that raises: each is OpenAI's JSON error, and the
    same client's next request is answered."""
    url, engine = server
    with httpx.Client(base_url=url, timeout=60) as c:
        def send(body: bytes, path: str = "/v1/completions", kind: str = "application/json") -> httpx.Response:
            return c.post(path, content=body, headers={"content-type": kind})
        head = b'{"model": "' + MODEL.encode() + b'", '
        assert_error(send(head + b'"prompt": "a\\ud800b"}'), 400, "prompt")
        assert_error(send(head + b'"messages": [{"role": "user", "content": "a\\ud800"}]}', "/v1/chat/completions"),
                     400, "messages")
        assert_error(send(head + b'"prompt": "hi", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), 400)
        assert_error(send(head + b'"prompt": "hi"}', kind="text/plain"), 415)
        def broken(text):
            raise RuntimeError("injected")
        with monkeypatch.context() as m:
            m.setattr(engine.tokenizer, "encode", broken)
            r = send(head + b'"prompt": "hi", "max_tokens": 2}')
            assert_error(r, 500)
            assert "injected" in r.json()["error"]["message"]
        assert send(head + b'"prompt": "hi", "max_tokens": 2}').json()["usage"]["completion_tokens"] == 2


def test_default_max_tokens_fits_the_room_a_long_prompt_leaves(server):
    """No max_tokens: the default (16, chat 512) is capped to what the context and KV pool leave."""
    url, engine = server
    room = min(engine.limits["max_model_len"], engine.limits["num_blocks"] * engine.limits["block_size"])
    def chat(k: int) -> list[dict]:
        return [{"role": "user", "content": " hi" * k}]     # " hi" is one token
    template = len(engine.tokenizer.messages_ids(chat(0)))
    messages = chat(room - 4 - template)                     # leaves 4 tokens of room
    assert len(engine.tokenizer.messages_ids(messages)) == room - 4
    r = post(url, {"model": MODEL, "messages": messages, "temperature": 0}, "/v1/chat/completions", timeout=300)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 4


def test_more_choices_than_the_server_holds_is_400_not_503(server, client):
    url, engine = server
    capacity, engine.capacity = engine.capacity, 3
    try:
        assert_error(post(url, {"model": MODEL, "prompt": ["a", "b"], "n": 2, "max_tokens": 2}), 400, "n")
    finally:
        engine.capacity = capacity
    assert client.completions.create(model=MODEL, prompt="hi", max_tokens=2).choices[0].text is not None


def test_priority_reaches_the_engine(server, client, monkeypatch):
    """vLLM's `priority` on both endpoints travels with the request to the engine loop."""
    url, engine = server
    sent = []
    class Spy:
        def __init__(self, inbox):
            self.inbox = inbox
        def put(self, msg):
            sent.append(msg)
            self.inbox.put(msg)
    monkeypatch.setattr(engine, "inbox", Spy(engine.inbox))
    client.completions.create(model=MODEL, prompt="hi", max_tokens=1, extra_body={"priority": -2})
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                   extra_body={"priority": 5})
    assert [m[4] for m in sent if m[0] == "add"] == [-2, 5]


def test_serve_refuses_bad_options_with_a_message(phase, capsys):
    """A malformed --engine-options, an option the engine does not take, or a bad value: one line
    on stderr and exit code 2, from this process, before any engine process starts."""
    serve = importlib.import_module(f"phases.{phase}.serve")
    with pytest.raises(SystemExit):
        serve.parse_args(["--engine-options", "foo"])
    assert "key=value" in capsys.readouterr().err
    before = set(multiprocessing.active_children())
    for options, message in (("foo=1", "error: unknown engine option foo (the engine takes: "),
                             ("max_num_seqs=0", "error: max_num_seqs must be a positive integer")):
        with pytest.raises(SystemExit) as exit_:
            serve.main(["--model", "tiny-llama", "--device", "cpu", "--engine-options", options])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.startswith(message) and err.count("\n") == 1, err
    assert set(multiprocessing.active_children()) == before
    with pytest.raises(ValueError, match="max_waiting"):
        importlib.import_module(f"phases.{phase}").AsyncLLM("tiny-llama", max_waiting=-1, device="cpu")


def test_full_server_answers_503_then_recovers(server, client):
    url, engine = server
    capacity, engine.capacity = engine.capacity, 1
    engine.requests[0] = None                   # a request in flight (keys start at 1) fills the place
    try:
        assert_error(post(url, {"model": MODEL, "prompt": "hi", "max_tokens": 2}), 503)
    finally:
        engine.capacity = capacity
        del engine.requests[0]
    assert client.completions.create(model=MODEL, prompt="hi", max_tokens=2).choices[0].text is not None


# --- clients that go away --------------------------------------------------------------------------
def state_entries(engine) -> int:
    """Entries in the server's per-request tables: the engine's live requests and every dict of its metrics."""
    metrics = next(observe.__self__ for observe in engine.observers)
    return len(engine.requests) + sum(len(v) for v in vars(metrics).values() if isinstance(v, dict))


def test_hundred_aborted_streams_free_the_pool_and_leave_no_state(server, client):
    url, engine = server
    before = state_entries(engine)
    body = {"model": MODEL, "prompt": "Tell me a long story.", "max_tokens": 500, "stream": True, "ignore_eos": True}

    async def one(c: httpx.AsyncClient) -> None:
        async with c.stream("POST", url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    return                       # first token seen: hang up mid-stream

    async def run():
        async with httpx.AsyncClient(timeout=120) as c:
            for _ in range(5):                   # 5 waves of 20 concurrent streams
                await asyncio.gather(*[one(c) for _ in range(20)])
    asyncio.run(run())
    m = wait_pool_full(url, engine)
    assert m["generation_tokens_total"] < 100 * 500 / 4       # they were cut short, not run out
    assert state_entries(engine) == before                    # nothing kept for the cut streams
    assert client.completions.create(model=MODEL, prompt="hi", max_tokens=3).usage.completion_tokens == 3


def test_client_gone_while_waiting_for_a_whole_reply(server):
    url, engine = server
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True}
    before = metrics(url)["generation_tokens_total"]
    with pytest.raises(httpx.ReadTimeout):           # the client gives up and closes the connection
        httpx.post(url + "/v1/completions", json=body, timeout=1.5)
    m = wait_pool_full(url, engine, timeout=10)
    assert m["generation_tokens_total"] - before < 2000      # aborted, not run out (~400 by then)


def test_metrics_report_requests_tokens_and_latencies(server, client):
    url, _ = server
    before = metrics(url)
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=5, extra_body={"ignore_eos": True})
    after = metrics(url)
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == 5
    assert after["time_to_first_token_seconds_count"] == before["time_to_first_token_seconds_count"] + 1
    assert after["inter_token_latency_seconds_count"] == before["inter_token_latency_seconds_count"] + 4
    text = httpx.get(url + "/metrics").text
    assert '# TYPE mini_infer:time_to_first_token_seconds histogram' in text
    assert 'mini_infer:inter_token_latency_seconds_bucket{le="+Inf"}' in text


# --- the engine failing, in the loop or as a whole process ------------------------------------------
class Outbox(list):
    def send(self, msg) -> None:
        self.append(msg)


def test_a_failed_step_fails_its_requests_and_the_loop_serves_on(phase, LLM):  # noqa: N803
    """EngineLoop in this process: one step raises; its requests end with "failed", their blocks
    are free, and the next request runs to the end."""
    import queue
    loop_mod = importlib.import_module(f"phases.{phase}.engine_loop")
    llm = LLM("tiny-llama", device="cpu", dtype="float32", kv_cache_bytes=1 << 20, detokenize=False)
    inbox, outbox = queue.Queue(), Outbox()
    loop = loop_mod.EngineLoop(llm, inbox, outbox)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    def broken_step():
        raise RuntimeError("injected")
    step, llm.step = llm.step, broken_step
    loop._handle(("add", 1, [5, 6, 7], params, 0))
    loop._step()
    assert outbox[-1][0] == "failed" and outbox[-1][1] == [1] and "injected" in outbox[-1][2]
    assert llm.scheduler.block_manager.num_free_blocks == llm.cache.num_blocks and not llm.has_unfinished()
    llm.step = step
    loop._handle(("add", 2, [5, 6, 7], params, -3))
    assert llm.requests[loop.live[2][0]].priority == -3       # the server's priority reaches the scheduler
    while llm.has_unfinished():
        loop._step()
    ends = [d for kind, *rest in outbox if kind == "step" for d in rest[0] if d[0] == 2 and d[3]]
    assert len(ends) == 1 and ends[0][3][0] == "length"


def test_a_dead_engine_process_is_an_error_not_a_hang(phase):
    """The engine process killed outright: the next submit fails with EngineDead within seconds."""
    import signal as signals
    module = importlib.import_module(f"phases.{phase}")
    async_engine = importlib.import_module(f"phases.{phase}.async_engine")
    engine = module.AsyncLLM("tiny-llama", device="cpu", dtype="float32", kv_cache_bytes=1 << 20)

    async def run():
        engine.start()
        os.kill(engine.proc.pid, signals.SIGKILL)
        deadline = time.monotonic() + 10
        while engine.alive and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        with pytest.raises(async_engine.EngineDead):
            await engine.submit([5, 6, 7], SamplingParams(temperature=0, max_tokens=2))
    try:
        asyncio.run(run())
    finally:
        engine.shutdown()


def test_a_dead_engine_fails_replies_in_flight_and_health_and_metrics_say_so(phase):
    """The engine process killed mid-reply: a whole reply gets 503 JSON, a stream an error event
    then [DONE]; /health answers 503 and /metrics no longer shows the dead engine's gauges."""
    module = importlib.import_module(f"phases.{phase}")
    engine = module.AsyncLLM("tiny-llama", device="cpu", dtype="float32", kv_cache_bytes=4 << 20)
    body = {"model": "tiny-llama", "prompt": [5, 6, 7], "max_tokens": 2000, "ignore_eos": True}
    with serving(module, engine, "tiny-llama") as url:
        whole = []
        waiter = threading.Thread(target=lambda: whole.append(httpx.post(url + "/v1/completions", json=body,
                                                                         timeout=60)))
        waiter.start()
        deadline = time.monotonic() + 30
        while metrics(url)["num_requests_running"] < 1:
            assert time.monotonic() < deadline, "the whole reply never ran"
        events = []
        with httpx.stream("POST", url + "/v1/completions", json=body | {"stream": True}, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and not events:
                    os.kill(engine.proc.pid, signal.SIGKILL)      # after the stream's first token
                events += [line] if line.startswith("data: ") else []
        waiter.join(timeout=60)
        assert events[-1] == "data: [DONE]" and '"error"' in events[-2], events[-3:]
        assert_error(whole[0], 503)
        assert_error(httpx.get(url + "/health"), 503)
        assert "num_requests_running" not in httpx.get(url + "/metrics").text
