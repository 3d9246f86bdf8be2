"""The OpenAI-compatible HTTP server: FastAPI routes over AsyncLLM (async_engine.py).

  GET  /health                 200 while the engine process lives, else 503
  GET  /v1/models              the one model this server serves
  POST /v1/completions         prompt: str | token ids | a list of either; n choices each
  POST /v1/chat/completions    messages through the model's chat template
  GET  /metrics                Prometheus text (metrics.py)

A streamed reply is Server-Sent Events in OpenAI's chunk format, one chunk per token, then an
optional usage chunk (stream_options.include_usage), then `data: [DONE]`. Every error is OpenAI's
JSON shape with its status: 400 bad input (malformed or too deeply nested JSON, a bad parameter,
a prompt over the context, more choices than the server ever holds), 404 an unknown model or route,
413 a body over the limit, 415 a body that is not JSON, 500 a bug (never a bare traceback), 503 a
full server or a dead engine (serve.py then exits). A stream that fails sends an error event, then
`data: [DONE]`. A client that goes away, mid-stream or while waiting for a whole reply, has its
requests aborted in the engine: their KV blocks are free at the next step boundary.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import aclosing, asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.detokenizer import ReplyText

from . import openai_protocol as oai
from .async_engine import AsyncLLM, EngineDead, Overloaded
from .metrics import ServerMetrics
from .openai_protocol import APIError

MAX_BODY_BYTES = 4 << 20       # a context of tokens as JSON ids is well under 1 MiB
DISCONNECT_POLL_S = 0.25       # how often a non-streamed request checks that its client is still there


def build_app(engine: AsyncLLM, model_name: str, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    metrics = ServerMetrics(engine)

    @asynccontextmanager
    async def lifespan(app):
        engine.start()                      # binds the engine's reader to this event loop
        yield
        engine.shutdown()                   # here, not after uvicorn.run(): on SIGTERM uvicorn
                                            # re-raises the signal once it has shut down

    app = FastAPI(title="mini-infer", lifespan=lifespan)

    @app.exception_handler(APIError)
    async def api_error(request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, e: StarletteHTTPException):      # unknown route, wrong method
        return JSONResponse(APIError(e.status_code, str(e.detail), type_="invalid_request_error").body(),
                            status_code=e.status_code)

    @app.get("/health")
    async def health():
        if not engine.alive:
            raise APIError(503, engine.error or "the engine is not running", type_="server_error")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "mini-infer", "max_model_len": engine.limits["max_model_len"]}]}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    async def complete(request: Request, chat: bool):
        try:
            return await answer(request, chat)
        except APIError:
            raise
        except Exception as e:              # a bug: still OpenAI's shape, and the connection lives on
            logging.getLogger(__name__).exception("request failed")
            raise APIError(500, f"internal error: {type(e).__name__}: {e}", type_="server_error") from e

    async def answer(request: Request, chat: bool):
        p = oai.parse(await read_json(request, max_body_bytes), chat)
        if p.model != model_name:
            raise APIError(404, f"the model {p.model!r} does not exist; this server serves {model_name!r}",
                           "model", code="model_not_found")
        prompts = [tokenize(engine.tokenizer, prompt, chat) for prompt in p.prompts]
        room = min(engine.limits["max_model_len"], engine.limits["num_blocks"] * engine.limits["block_size"])
        choices = [(i * p.n + j, ids, oai.for_choice(p, j, room - len(ids)))
                   for i, ids in enumerate(prompts) for j in range(p.n)]
        reqs = await submit_all(engine, choices, "messages" if chat else "prompt", p.priority)
        rid, prompt_tokens = oai.new_id(chat), sum(len(ids) for ids in prompts) * p.n
        if p.stream:
            texts = {index: ReplyText(engine.tokenizer, p.params.stop) for index, _, _ in choices}
            events = stream_events(engine, reqs, texts, rid, model_name, chat, p, prompt_tokens)
            return EventSourceResponse(events, ping=15)
        reply = await whole_reply(request, engine, reqs, rid, model_name, chat, prompt_tokens, p.return_token_ids)
        return JSONResponse(reply)

    return app


async def read_json(request: Request, limit: int):
    """The body as JSON; 413 past `limit` bytes (checked before reading when the length is sent).
    A body sent as another type (a form, text/plain) is refused, not guessed at."""
    kind = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if kind != "application/json":
        raise APIError(415, f"the request body must be JSON (Content-Type: application/json), not {kind!r}")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise APIError(413, f"the request body ({length} bytes) is over the limit of {limit} bytes")
    body = b""
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise APIError(413, f"the request body is over the limit of {limit} bytes")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise oai.bad(f"the request body is not valid JSON: {e}")
    except RecursionError:                 # json recurses per level, ignored fields included
        raise oai.bad("the request body's JSON is nested too deeply")


def tokenize(tokenizer, prompt, chat: bool) -> list[int]:
    if chat:
        try:
            return tokenizer.messages_ids(prompt)
        except ValueError as e:            # no chat template
            raise oai.bad(str(e), "messages")
    return tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)


async def submit_all(engine: AsyncLLM, choices: list, param: str, priority: int) -> list:
    """Submit every choice at once; if any is refused, abort the others and answer the first error.
    More choices than the server ever holds is 400: a retry (503) could never succeed."""
    if len(choices) > engine.capacity:
        raise oai.bad(f"{len(choices)} choices (prompts x n) are more than this server holds at once "
                      f"({engine.capacity}); split the request", "n")
    results = await asyncio.gather(*[engine.submit(ids, params, priority) for _, ids, params in choices],
                                   return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if not errors:
        return [(index, req) for (index, _, _), req in zip(choices, results)]
    for r in results:
        if not isinstance(r, BaseException):
            engine.abort(r)
    e = errors[0]
    if isinstance(e, ValueError):
        raise oai.bad(str(e), param)
    if isinstance(e, Overloaded):
        raise APIError(503, str(e), type_="server_overloaded", code="server_overloaded")
    if isinstance(e, EngineDead):
        raise APIError(503, str(e), type_="server_error")
    raise e


async def merged(engine: AsyncLLM, reqs: list):
    """(choice index, delta) of every request as they come. Leaving early aborts them all."""
    if len(reqs) == 1:                      # the common case: no extra task per token
        index, req = reqs[0]
        async with aclosing(engine.stream(req)) as deltas:
            async for delta in deltas:
                yield index, delta
        return
    inbox: asyncio.Queue = asyncio.Queue()

    async def pump(index, req):
        try:
            async with aclosing(engine.stream(req)) as deltas:
                async for delta in deltas:
                    inbox.put_nowait((index, delta))
        except Exception as e:              # noqa: BLE001 - handed to the reader below
            inbox.put_nowait((index, e))
    tasks = [asyncio.create_task(pump(index, req)) for index, req in reqs]
    try:
        left = len(tasks)
        while left:
            index, item = await inbox.get()
            if isinstance(item, Exception):
                raise item
            left -= item.finish is not None
            yield index, item
    finally:
        for task in tasks:
            task.cancel()                   # a cancelled pump closes its stream: the request is aborted


async def stream_events(engine, reqs, texts, rid, model, chat, p: oai.Parsed, prompt_tokens):
    """SSE events: a chunk per token, [usage], [DONE]. If the client disconnects, sse-starlette
    cancels this generator, and closing merged() aborts every request of the reply."""
    completion_tokens, started, cached = 0, set(), {}
    async with aclosing(merged(engine, reqs)) as deltas:
        try:
            async for index, delta in deltas:
                cached[index] = delta.cached_tokens
                for k, token in enumerate(delta.token_ids):
                    last = delta.finish is not None and k == len(delta.token_ids) - 1
                    piece = texts[index].finish(delta.finish[1]) if last else texts[index].add([token])
                    reason = delta.finish[0] if last else None
                    ids = [token] if p.return_token_ids else None
                    yield sse(oai.chunk(rid, model, chat, index, piece, reason, index not in started, ids))
                    started.add(index)
                    completion_tokens += 1
        except Exception as e:              # noqa: BLE001 - the engine failed mid-reply: say so in the
            yield sse(server_error(e).body())      # stream, then end it as every stream ends (vLLM's way)
            yield {"data": "[DONE]"}
            return
    if p.include_usage:
        yield sse(oai.usage_chunk(rid, model, chat, oai.usage(prompt_tokens, completion_tokens, sum(cached.values()))))
    yield {"data": "[DONE]"}


def sse(obj: dict) -> dict:
    return {"data": json.dumps(obj, ensure_ascii=False, separators=(",", ":"))}


async def whole_reply(request, engine, reqs, rid, model, chat, prompt_tokens, token_ids: bool) -> dict:
    """Collect every choice; give up (and abort) if the client disconnects while waiting."""
    async def collect():
        ids, outs, cached = {index: [] for index, _ in reqs}, {}, {}
        async with aclosing(merged(engine, reqs)) as deltas:
            async for index, delta in deltas:
                ids[index] += delta.token_ids
                cached[index] = delta.cached_tokens
                if delta.finish is not None:
                    outs[index] = (index, delta.finish[1], delta.finish[0], ids[index])
        return [outs[i] for i in sorted(outs)], sum(map(len, ids.values())), sum(cached.values())
    task = asyncio.create_task(collect())
    while not task.done():
        await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if not task.done() and await request.is_disconnected():
            task.cancel()                   # closes merged(): the requests are aborted
            raise oai.bad("the client closed the request")   # nobody reads it; vLLM answers 400 too
    try:
        choices, tokens, cached = task.result()
    except Exception as e:                  # noqa: BLE001
        raise server_error(e)
    return oai.response(rid, model, chat, choices, oai.usage(prompt_tokens, tokens, cached), token_ids)


def server_error(e: Exception) -> APIError:
    """The engine failed a request: 503 once its process is dead (as is every later request), else 500."""
    return APIError(503 if isinstance(e, EngineDead) else 500, str(e), type_="server_error")
