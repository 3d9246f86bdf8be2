"""WorkerPool: the parent's side of the worker processes: start, command, gather, stop.

Replies are awaited in short slices; between slices every worker must still be alive, so a worker
that crashes (even one killed without a word) is an error in the parent within about a second,
never a hang. Every call has an id, sent with its commands and published in a shared value while
the parent waits: if the wait ends early (Ctrl-C, an error), the workers abort the call at their
next step and any late reply is dropped by its id, so the next call gets its own outputs.
Workers are daemon processes and are stopped on shutdown(), on garbage collection and at
interpreter exit (weakref.finalize); a parent killed outright takes them along (worker.py).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import tempfile
import time
import traceback
import weakref
from pathlib import Path

from . import worker
from .worker import STOP, WorkerSpec

POLL_S = 0.5          # how long one wait for a reply lasts before the workers are checked
START_TIMEOUT_S = 900  # building an engine: imports, weights, KV pool (large models take minutes)
STOP_TIMEOUT_S = 5    # a clean exit; after that the worker is terminated


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WorkerPool:
    def __init__(self, model: str, options: dict, parallel: str, world_size: int):
        spec = WorkerSpec(model, options, parallel, world_size, free_port())
        ctx = context()
        self.results = ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(world_size)]
        self.current = ctx.Value("q", 0)      # the id of the call the parent waits for (0: none)
        self.last_call, self.failure = 0, None
        self.procs = [ctx.Process(target=worker.main, name=f"engine-worker-{rank}", daemon=True,
                                  args=(rank, spec, self.commands[rank], self.results, self.current))
                      for rank in range(world_size)]
        start(self.procs)
        self._stop = weakref.finalize(self, stop_workers, self.procs, self.commands)
        self.gather(range(world_size), 0, timeout=START_TIMEOUT_S)     # every worker says "ready"

    def call(self, commands: dict[int, tuple[str, object]]) -> dict[int, object]:
        """Send each rank its (name, payload); return each rank's reply. A rank that found a
        request it cannot take raises ValueError here, a call that failed in a worker raises
        RuntimeError; either way after every reply is in, and the pool serves the next call."""
        self._check_alive(None)               # a pool with a dead worker takes no more work
        self.last_call += 1
        call_id = self.current.value = self.last_call
        try:
            for rank, (name, payload) in commands.items():
                self.commands[rank].put((name, call_id, payload))
            replies = self.gather(commands, call_id)
        finally:
            self.current.value = 0            # over, or given up: workers abort what is left
        for rank, (kind, payload) in replies.items():
            if kind == "invalid":
                raise ValueError(payload)
            if kind == "failed":
                self._check_alive(None)       # a dead peer is the cause: a stage saw its link drop
                raise RuntimeError(f"worker {rank} failed this call (it serves the next one):\n{payload}")
        return {rank: payload for rank, (_, payload) in replies.items()}

    def gather(self, ranks, call_id: int, timeout: float | None = None) -> dict[int, tuple[str, object]]:
        """One reply per rank to call `call_id`: {rank: (kind, payload)}. Replies to an earlier
        call are dropped. A worker error stops the pool and raises."""
        replies, deadline = {}, None if timeout is None else time.monotonic() + timeout
        while len(replies) < len(ranks):
            try:
                kind, rank, reply_id, payload = self.results.get(timeout=POLL_S)
            except queue.Empty:
                self._check_alive(deadline)
                continue
            if kind == "error":
                self._worker_error(rank, payload)
            if reply_id == call_id:
                replies[rank] = (kind, payload)
        return replies

    def _check_alive(self, deadline: float | None) -> None:
        if not self.alive:
            raise RuntimeError(self.failure or "this engine is shut down")
        dead = [(rank, proc) for rank, proc in enumerate(self.procs) if not proc.is_alive()]
        if dead:
            try:                              # its last words may still be in the queue
                kind, rank, _, payload = self.results.get(timeout=POLL_S)
                if kind == "error":
                    self._worker_error(rank, payload)
            except queue.Empty:
                pass
            rank, proc = dead[0]
            words = last_words(proc.pid)
            why = f"; starting up, it failed:\n{words.read_text()}" if words.exists() else ""
            words.unlink(missing_ok=True)
            self._fail(f"worker {rank} died (exit code {proc.exitcode}){why}")
        if deadline is not None and time.monotonic() > deadline:
            self._fail("workers did not answer in time")

    def _worker_error(self, rank: int, payload: str):
        """A worker's traceback. If a peer is dead, that is the cause (the survivor only saw its
        connection to the peer drop), so the message names the dead one first."""
        dead = [(r, proc.exitcode) for r, proc in enumerate(self.procs) if r != rank and not proc.is_alive()]
        cause = "".join(f"worker {r} died (exit code {code}); " for r, code in dead)
        self._fail(f"{cause}worker {rank} failed:\n{payload}")

    def _fail(self, message: str):
        """A dead worker: stop the rest, and refuse every later call with the same message."""
        self.failure = f"this engine is unusable: {message}"
        self.shutdown()
        raise RuntimeError(message)

    def shutdown(self) -> None:
        self._stop()                          # runs once; later calls do nothing

    @property
    def alive(self) -> bool:
        return self._stop.alive


def context():
    """Workers come from multiprocessing's fork server: a clean process, started with the first
    pool of this process, that imports the worker's code (torch, the engine) once; each worker is
    a fork of it. spawn would start a fresh interpreter and import torch again in every worker
    (seconds each), and forking this process would copy its threads and CUDA state; the fork
    server has neither. It keeps the environment of its start: a variable set later in this
    process does not reach the workers (set it before the first pool).

    A fork of a process that asked the CUDA driver anything, even torch.cuda.is_available() (which
    libraries call at import), cannot use CUDA: with FlashAttention 4 on the path, an engine process
    failed to start so. With the NVML-based check, is_available() asks NVML, not the driver."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")    # before the fork server starts
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([worker.__name__])   # no effect once the server runs
    return ctx


def start(procs) -> None:
    """Start the workers. Each one runs the main script again (as spawn does): a script that builds
    a parallel engine outside `if __name__ == "__main__":` gets here inside a worker, where starting
    processes fails. That worker leaves the traceback for the parent, which reports it."""
    try:
        for proc in procs:
            proc.start()
    except RuntimeError:
        if getattr(mp.current_process(), "_inheriting", False):    # the worker's "still starting up"
            last_words(os.getpid()).write_text(traceback.format_exc())
        raise


def last_words(pid: int) -> Path:
    """Where worker `pid` leaves the error that ended its start (named by its own pid only: its
    parent is the fork server, not the pool)."""
    return Path(tempfile.gettempdir(), f"engine-worker-{pid}.txt")


def stop_workers(procs, commands) -> None:
    """Ask every worker to stop, wait a little, then terminate whatever is left."""
    for proc, q in zip(procs, commands):
        if proc.is_alive():
            q.put(STOP)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(1)
        if proc.is_alive():
            proc.kill()
            proc.join(1)
    for q in commands:
        q.cancel_join_thread()              # never block exit on a message nobody will read
