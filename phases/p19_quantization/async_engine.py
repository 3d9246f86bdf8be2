"""AsyncLLM: the server's handle on the engine loop (engine_loop.py), for asyncio code.

  handler (event loop)                 reader thread                    engine process
  submit(ids, params, priority) --inbox--------------------------------> add_request
  await accepted      <-- "added" / "invalid" --- deliver() <--outbox--- (at once)
  async for delta in stream(req) <------ deliver() <------ "step" ------- after every step
  abort(req) (client gone) --inbox-------------------------------------> abort_request

A reader thread receives the loop's messages and hands each one to the event loop in a single
call_soon_threadsafe (one per step, not one per token). Each request reads its deltas from its own
unbounded asyncio.Queue, so the engine never waits for a slow client and the event loop never
waits for a step. A request the server gives up on (a client that went away, an error) is aborted
in the engine at its next step boundary and its KV blocks are free again.
"""
from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import os
import threading
import time
import weakref
from dataclasses import dataclass, field

from common.loader import resolve
from common.sampling import SamplingParams

from . import engine_loop

START_TIMEOUT_S = 900    # the engine process builds the model: imports, weights, KV pool
POLL_S = 0.5             # the reader checks that the engine process lives this often


class Overloaded(Exception):
    """Too many requests in the server already: the client should retry later (HTTP 503)."""


class EngineDead(Exception):
    """The engine process is gone: nothing more can be served (HTTP 503)."""


@dataclass
class Delta:
    token_ids: list[int]                 # new since the previous delta
    token_times: list[float]             # when each was sampled (time.perf_counter, this host)
    finish: tuple[str, str] | None       # on the last delta: (finish_reason, final text)
    cached_tokens: int = 0               # prompt tokens read from the prefix cache, not computed


@dataclass
class Request:
    key: int
    prompt_ids: list[int]
    params: SamplingParams
    arrival: float
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)   # Delta | Exception | "added"
    done: bool = False                   # finished, failed or aborted: the engine holds nothing
    last_token_time: float | None = None  # metrics.py's, for inter-token latency: here, it goes
                                          # with the request however the request ends


class AsyncLLM:
    def __init__(self, model: str, max_waiting: int = 1024, **options):
        """Start the engine process for LLM(model, **options) and wait until it is ready.
        At most max_num_seqs + max_waiting requests are in the server at once; more get Overloaded."""
        if not isinstance(max_waiting, int) or max_waiting < 0:
            raise ValueError(f"max_waiting must be an integer >= 0, got {max_waiting!r}")
        self.source = resolve(model, seed=options.get("seed", 0))
        self.tokenizer = self.source.tokenizer
        self.model = model
        ctx = context()                          # a fork server: no torch import per start
        self.inbox = ctx.Queue()                 # its feeder thread: submit() never blocks the event loop
        self.outbox, loop_end = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=engine_loop.main, name="engine-loop", daemon=True,
                                args=(model, options, self.inbox, loop_end))
        self.proc.start()
        loop_end.close()                         # the engine process holds the only sending end
        self._finalizer = weakref.finalize(self, stop_process, self.proc, self.inbox, self.outbox)
        self.limits = self._wait_ready()
        self.capacity = self.limits["max_num_seqs"] + max_waiting
        self.gauges = {"running": 0, "waiting": 0, "swapped": 0, "kv_blocks_free": self.limits["num_blocks"],
                       "preemptions": 0, "cache_queries": 0, "cache_hits": 0}
        self.requests: dict[int, Request] = {}   # key -> unfinished request (event loop only)
        self.observers = []                      # called with (request, delta) on the event loop
        self._keys = itertools.count(1)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.error: str | None = None            # why the engine process is gone
        self.on_dead = None                      # called on the event loop once it is (serve.py exits)

    def _wait_ready(self) -> dict:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not self.outbox.poll(POLL_S):
                if not self.proc.is_alive():
                    raise RuntimeError(f"the engine process exited with code {self.proc.exitcode} while starting")
                continue
            kind, payload = self.outbox.recv()
            if kind == "error":
                raise RuntimeError(f"the engine process failed to start:\n{payload}")
            return payload
        raise RuntimeError(f"the engine process was not ready after {START_TIMEOUT_S} s")

    # --- event loop side ------------------------------------------------------------------------
    def start(self) -> None:
        """Bind to the running event loop and start reading the engine's messages."""
        self.loop = asyncio.get_running_loop()
        threading.Thread(target=self._read, name="engine-reader", daemon=True).start()

    @property
    def alive(self) -> bool:
        return self.error is None and self.proc.is_alive()

    async def submit(self, prompt_ids: list[int], params: SamplingParams, priority: int = 0) -> Request:
        """Queue one request (lower priority runs first); return once the engine took it. Raises
        ValueError when the engine refuses it (over the context or the KV pool, a token id past the
        vocab, a bad priority), Overloaded when the server is full, EngineDead when its process is gone."""
        if not self.alive:
            raise EngineDead(self.error or "the engine process is not running")
        if len(self.requests) >= self.capacity:
            raise Overloaded(f"{len(self.requests)} requests in the server already; retry later")
        req = Request(next(self._keys), prompt_ids, params, time.perf_counter())
        self.requests[req.key] = req
        self.inbox.put(("add", req.key, prompt_ids, params, priority))
        try:
            first = await req.queue.get()        # "added", or the reason it was refused
        except BaseException:
            self.abort(req)                      # the client left before the engine answered
            raise
        if isinstance(first, Exception):
            raise first
        return req

    async def stream(self, req: Request):
        """The request's deltas as the engine produces them; the last one carries `finish`.
        Leaving early (the client went away, a cancelled task) aborts the request in the engine."""
        try:
            while True:
                item = await req.queue.get()
                if isinstance(item, Exception):
                    raise item
                yield item
                if item.finish is not None:
                    return
        finally:
            self.abort(req)

    def abort(self, req: Request) -> None:
        """Drop a request the server no longer wants. A no-op once it finished."""
        if not req.done:
            req.done = True
            self.requests.pop(req.key, None)
            self.inbox.put(("abort", req.key))

    def shutdown(self) -> None:
        self._finalizer()

    # --- reader thread -> event loop ------------------------------------------------------------
    def _read(self) -> None:
        """Reader thread: forward every message of the engine process to the event loop."""
        while True:
            try:
                msg = self.outbox.recv() if self.outbox.poll(POLL_S) else None
            except (EOFError, OSError):          # the engine process is gone (its end closed)
                msg = None
            if msg is None:
                if self.proc.is_alive():
                    continue
                self.proc.join()
                msg = ("dead", f"the engine process exited with code {self.proc.exitcode}")
            try:
                self.loop.call_soon_threadsafe(self._deliver, msg)
            except RuntimeError:                 # the event loop is closed: shutting down
                return
            if msg[0] == "dead":
                return

    def _deliver(self, msg: tuple) -> None:
        """On the event loop: route one engine message to the requests it concerns."""
        kind = msg[0]
        if kind == "added":
            self._put(msg[1], "added")
        elif kind == "invalid":
            self._finish(msg[1], ValueError(msg[2]))
        elif kind == "step":
            for key, ids, times, finish, cached in msg[1]:
                self._put(key, Delta(ids, times, finish, cached), last=finish is not None)
            self.gauges = msg[2]
        elif kind == "gauges":
            self.gauges = msg[1]
        elif kind == "failed":
            for key in msg[1]:
                self._finish(key, RuntimeError(f"the engine step failed: {msg[2]}"))
        elif kind == "dead" and self._finalizer.alive:   # not after shutdown(): that end was asked for
            self.error = msg[1]
            for key in list(self.requests):
                self._finish(key, EngineDead(msg[1]))
            if self.on_dead is not None:
                self.on_dead()

    def _put(self, key: int, item, last: bool = False) -> None:
        req = self.requests.get(key)
        if req is None:
            return                               # aborted meanwhile: nobody is listening
        if isinstance(item, Delta):
            for observe in self.observers:
                observe(req, item)
        req.queue.put_nowait(item)
        if last:
            req.done = True
            del self.requests[key]

    def _finish(self, key: int, error: Exception) -> None:
        req = self.requests.pop(key, None)
        if req is not None:
            req.done = True
            req.queue.put_nowait(error)


def stop_process(proc, inbox, outbox) -> None:
    """Ask the engine loop to stop; terminate it if it does not within a few seconds."""
    if proc.is_alive():
        try:
            inbox.put(("stop",))
        except (ValueError, OSError):
            pass
        proc.join(timeout=5)
    if proc.is_alive():
        proc.terminate()
        proc.join(timeout=5)
    inbox.close()                          # release the pipes and semaphores now, not at exit
    inbox.cancel_join_thread()
    outbox.close()


def context():
    """The engine process comes from multiprocessing's fork server: a clean process, started
    once, that imports the engine's code (torch, the engine) once; each engine process is a fork
    of it. spawn would import torch again for every server start, and forking this process would
    copy its threads and CUDA state; the fork server has neither.

    A fork of a process that asked the CUDA driver anything, even torch.cuda.is_available() (which
    libraries call at import), cannot use CUDA: with FlashAttention 4 on the path, an engine process
    failed to start so. With the NVML-based check, is_available() asks NVML, not the driver."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")    # before the fork server starts
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([engine_loop.__name__])   # no effect once the server runs
    return ctx
