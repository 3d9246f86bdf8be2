"""The engine loop: a process that owns the engine and steps it for a server.

The engine (engine.py) is synchronous: step() blocks for a whole forward pass. A server must keep
answering while that happens, and its own Python work (HTTP parsing, JSON, one SSE chunk per token
per request) must not slow the steps. So the engine runs in a process of its own, with its own
interpreter lock, and talks to the server through a queue and a pipe:

  inbox  (server -> loop, a multiprocessing Queue: the server never blocks on a busy engine): ("add", key, prompt_ids, SamplingParams, priority) | ("abort", key) | ("stop",)
  outbox (loop -> server, a Pipe: sent from the loop's own thread, no feeder thread taking turns
                           with the step for the interpreter lock):
                           ("ready", limits)
                           ("added", key) | ("invalid", key, message)     one per "add", at once
                           ("step", [(key, new ids, their times, finished, cached)...], gauges)
                           ("gauges", gauges)                             after aborts on an idle engine
                           ("failed", [keys], message)                    a step raised: those requests end
`key` is the server's request id; `finished` is None or (finish_reason, final text); `cached` the
prompt tokens the request found in the prefix cache.

The loop drains the inbox between steps and blocks on it only when there is nothing to step, so a
request that arrives mid-step joins at the next step (continuous batching, as before) and an
abort frees the request's KV blocks before the next step. Nothing in the loop waits for the server.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import threading
import traceback
from multiprocessing.connection import wait

from .engine import LLM

IDLE_WAIT_S = 0.5      # an idle loop wakes this often (a "stop" wakes it at once anyway)


def main(model: str, options: dict, inbox, outbox) -> None:
    """Process entry: build the engine, say "ready" with its limits, then serve until "stop"."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the server's to handle; its death ends us
    exit_with_parent()
    try:
        llm = LLM(model, **options)
    except BaseException:                          # noqa: BLE001 - the server reports it and exits
        outbox.send(("error", traceback.format_exc()))
        return
    outbox.send(("ready", limits(llm)))
    EngineLoop(llm, inbox, outbox).run()


def exit_with_parent() -> None:
    """End this process as soon as the parent is gone, even SIGKILLed with no chance to stop us.
    The parent holds the write end of a pipe (multiprocessing's parent sentinel): at its death
    the read end here sees end-of-file. A daemon thread waits on it, so a loop blocked in a
    step still exits (and its tensor-parallel ranks with it: they die with their parent)."""
    sentinel = mp.parent_process().sentinel

    def watch():
        wait([sentinel])
        os._exit(1)
    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def limits(llm: LLM) -> dict:
    return {"max_model_len": llm.max_model_len, "num_blocks": llm.cache.num_blocks,
            "block_size": llm.cache.block_size, "max_num_seqs": llm.config.max_num_seqs}


class EngineLoop:
    def __init__(self, llm: LLM, inbox, outbox):
        self.llm, self.inbox, self.outbox = llm, inbox, outbox
        self.live: dict[int, tuple[int, int]] = {}      # key -> (engine request id, tokens sent)

    def run(self) -> None:
        while True:
            for msg in self._drain(block=not self.llm.has_unfinished()):
                if msg[0] == "stop":
                    return
                self._handle(msg)
            if self.llm.has_unfinished():
                self._step()

    def _drain(self, block: bool):
        """Every message waiting now; when idle, first wait (in slices) for one to arrive."""
        try:
            yield self.inbox.get(timeout=IDLE_WAIT_S) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            try:
                yield self.inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, msg: tuple) -> None:
        if msg[0] == "add":
            _, key, prompt_ids, params, priority = msg
            try:
                request_id = self.llm.add_request(prompt_ids, params, priority)
            except ValueError as e:                     # over the context, over the pool, bad ids
                self.outbox.send(("invalid", key, str(e)))
                return
            self.live[key] = (request_id, 0, self.llm.requests[request_id])
            self.outbox.send(("added", key))
        elif msg[0] == "abort":
            entry = self.live.pop(msg[1], None)
            if entry is not None:
                self.llm.abort_request(entry[0])        # its KV blocks are free from here on
                if not self.llm.has_unfinished():
                    self.outbox.send(("gauges", self.gauges()))

    def _step(self) -> None:
        try:
            finished = dict(self.llm.step())
        except Exception as e:                          # noqa: BLE001 - the requests fail, the loop lives
            keys = list(self.live)
            for request_id, *_ in self.live.values():
                self.llm.abort_request(request_id)
            self.live.clear()
            self.llm.recover()                          # the step may have stopped mid-bookkeeping
            self.outbox.send(("failed", keys, f"{type(e).__name__}: {e}"))
            return
        self.outbox.send(("step", self._deltas(finished), self.gauges()))

    def _deltas(self, finished: dict) -> list[tuple]:
        """Each live request's tokens since the last message, and how it ended if it did."""
        deltas = []
        for key, (request_id, sent, seq) in list(self.live.items()):
            out = finished.get(request_id)
            ids = out.token_ids if out else seq.output_ids
            times = out.token_times if out else seq.token_times
            if len(ids) == sent and out is None:
                continue                                # waiting, or just prefilled a recompute
            end = (out.finish_reason, out.text) if out else None
            deltas.append((key, ids[sent:], times[sent:], end, seq.num_cached_tokens or 0))
            if out:
                del self.live[key]
            else:
                self.live[key] = (request_id, len(ids), seq)
        return deltas

    def gauges(self) -> dict:
        s = self.llm.scheduler
        return {"running": len(s.running), "waiting": len(s.waiting), "swapped": len(s.swapped),
                "kv_blocks_free": s.block_manager.num_free_blocks, "preemptions": s.num_preemptions,
                "cache_queries": s.cache_queries, "cache_hits": s.cache_hits, **self.llm.speculator.counters()}
