"""WorkerPool: the parent's side of the worker processes: spawn, command, gather, stop.

Replies are awaited in short slices; between slices every worker must still be alive, so a worker
that crashes (even one killed without a word) is an error in the parent within about a second,
never a hang. Workers are daemon processes and are stopped on shutdown(), on garbage collection
and at interpreter exit (weakref.finalize), so none outlives the parent.
"""
from __future__ import annotations

import multiprocessing as mp
import queue
import socket
import time
import weakref

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
        ctx = mp.get_context("spawn")         # fork would copy the parent's threads and CUDA state
        self.results = ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(world_size)]
        self.procs = [ctx.Process(target=worker.main, args=(rank, spec, self.commands[rank], self.results),
                                  name=f"engine-worker-{rank}", daemon=True) for rank in range(world_size)]
        for proc in self.procs:
            proc.start()
        self._stop = weakref.finalize(self, stop_workers, self.procs, self.commands)
        self.gather(range(world_size), timeout=START_TIMEOUT_S)     # every worker says "ready"

    def call(self, commands: dict[int, tuple]) -> dict[int, object]:
        """Send each rank its command; return each rank's reply. A rank that found a request it
        cannot take raises ValueError here (after every reply is in, so the pool stays usable)."""
        self._check_alive(None)               # a pool with a dead worker takes no more work
        for rank, command in commands.items():
            self.commands[rank].put(command)
        replies = self.gather(commands)
        invalid = [payload for kind, payload in replies.values() if kind == "invalid"]
        if invalid:
            raise ValueError(invalid[0])
        return {rank: payload for rank, (_, payload) in replies.items()}

    def gather(self, ranks, timeout: float | None = None) -> dict[int, tuple[str, object]]:
        """One reply per rank: {rank: (kind, payload)}. A worker error stops the pool and raises."""
        replies, deadline = {}, None if timeout is None else time.monotonic() + timeout
        while len(replies) < len(ranks):
            try:
                kind, rank, payload = self.results.get(timeout=POLL_S)
            except queue.Empty:
                self._check_alive(deadline)
                continue
            if kind == "error":
                self._worker_error(rank, payload)
            replies[rank] = (kind, payload)
        return replies

    def _check_alive(self, deadline: float | None) -> None:
        dead = [(rank, proc.exitcode) for rank, proc in enumerate(self.procs) if not proc.is_alive()]
        if dead:
            try:                              # its last words may still be in the queue
                kind, rank, payload = self.results.get(timeout=POLL_S)
                if kind == "error":
                    self._worker_error(rank, payload)
            except queue.Empty:
                pass
            self._fail(f"worker {dead[0][0]} died (exit code {dead[0][1]})")
        if deadline is not None and time.monotonic() > deadline:
            self._fail("workers did not answer in time")

    def _worker_error(self, rank: int, payload: str):
        """A worker's traceback. If a peer is dead, that is the cause (the survivor only saw its
        connection to the peer drop), so the message names the dead one first."""
        dead = [(r, proc.exitcode) for r, proc in enumerate(self.procs) if r != rank and not proc.is_alive()]
        cause = "".join(f"worker {r} died (exit code {code}); " for r, code in dead)
        self._fail(f"{cause}worker {rank} failed:\n{payload}")

    def _fail(self, message: str):
        self.shutdown()
        raise RuntimeError(message)

    def shutdown(self) -> None:
        self._stop()                          # runs once; later calls do nothing

    @property
    def alive(self) -> bool:
        return self._stop.alive


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
