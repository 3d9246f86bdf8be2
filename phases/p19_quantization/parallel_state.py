"""Tensor parallelism's process groups: who this rank is, how the ranks start, what they exchange.

N ranks (processes, one device each) hold 1/N of every layer's weights and of the KV pool
(parallel_layers.py). Every rank runs the whole engine: the same scheduler, block manager and
speculator, fed the same inputs, make the same decisions, so a step's plan never travels. What
travels is only what one rank decides for all (rank 0, the driver, which the user talks to):

    mailbox (the rendezvous's TCP store; host objects, in order):
                           ("step", ops)      before every step: the requests added, aborted, the
                                              cache reset or recover() since the last one
                           ("tokens", tokens) after a step's forward: what rank 0 sampled
                           ("stop", None)     shutdown()
    compute (NCCL on GPUs, gloo on CPU):  two all-reduces a layer, one all-gather of the logits

The alternative (one scheduler whose plan is broadcast every step, as vLLM does) sends O(batch x
context / block_size) block-table entries per step or keeps a cache of them on every worker;
here a step sends O(new requests + batch) integers. The price: every rank pays the host work of
scheduling (in parallel with the others), and the engine must be deterministic, which it is
(no clocks, no random numbers and no unordered sets decide a plan; sampling happens once).

Two ways to start, one code path. torchrun (or any launcher) sets RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT and runs the script on every rank; LLM(..., tensor_parallel_size=N)
in a process without them is rank 0 and starts ranks 1..N-1 itself (`python -m <phase>.rank`),
each with those variables set as a launcher would.

Faults. A collective that waits longer than timeout_s raises (gloo's timeout; NCCL's watchdog):
a rank that died or hangs ends the engine with an error that names it, never a hang. Rank 0 posts
a message without waiting for anyone (a collective would: gloo's send completes when the peer
receives, so a hung rank would hang rank 0 in a mere broadcast); the others wait for the next one
without a bound, an idle engine not being a hung one. A spawned rank exits with its parent
(PR_SET_PDEATHSIG), and any rank when the store, which lives in rank 0, goes away.
"""
from __future__ import annotations

import ctypes
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from common.weights import first_line

LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
IDLE_FOREVER = timedelta(days=365)   # how long a follower waits for rank 0's next message
START_TIMEOUT_S = 600                # every rank joins (imports, then the rendezvous) within this
STOP_TIMEOUT_S = 10                  # a follower's clean exit after "stop"; then it is killed
KEPT_MESSAGES = 16                   # rank 0 deletes older ones: no rank lags a forward behind


class Resync(Exception):
    """A follower expected a step's tokens and got rank 0's next message instead: rank 0's step
    failed after the forward (its recover() follows in `message`)."""

    def __init__(self, message):
        super().__init__("rank 0 gave up the step")
        self.message = message


class TensorParallel:
    """One engine's process groups, from this rank's side. rank 0 drives; others follow."""

    def __init__(self, rank: int, world_size: int, device: str, timeout_s: float, store, procs=()):
        self.rank, self.world_size, self.device = rank, world_size, device
        self.timeout_s, self.procs = timeout_s, list(procs)     # procs: ranks rank 0 spawned
        self.store, self.sent, self.read = store, 0, 0          # the mailbox: messages sent / read
        self.failure: str | None = None      # why this engine is unusable

    @property
    def driver(self) -> bool:
        return self.rank == 0

    # --- the compute collectives (every rank, inside a forward; NCCL captures them in graphs) ----
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the ranks, in place: a row-parallel layer's partial products."""
        dist.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """(..., n) on every rank -> (..., world_size * n), rank r's part at [r*n, (r+1)*n)."""
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def agree_min(self, n: int) -> int:
        """The smallest n over the ranks (each sizes its KV pool from its own free memory; every
        rank must have as many blocks, or their block managers would decide differently).
        Through the store: ranks may finish loading far apart, and a collective would time out."""
        self.store.set(f"min/{self.rank}", str(n))
        return min(int(self.store.get(f"min/{r}")) for r in range(self.world_size))

    # --- messages (host objects, rank 0 -> every rank, in order) -------------------------------
    def send(self, kind: str, payload=None) -> None:
        self.store.set(f"msg/{self.sent}", pickle.dumps((kind, payload)))
        if self.sent >= KEPT_MESSAGES:
            self.store.delete_key(f"msg/{self.sent - KEPT_MESSAGES}")
        self.sent += 1

    def receive(self) -> tuple[str, object]:
        message = pickle.loads(self.store.get(f"msg/{self.read}"))     # waits for it to exist
        self.read += 1
        return message

    def receive_tokens(self) -> list[list[int]]:
        message = self.receive()
        if message[0] != "tokens":
            raise Resync(message)
        return message[1]

    # --- faults -----------------------------------------------------------------------------
    def check(self) -> None:
        if self.failure:
            raise RuntimeError(self.failure)

    def broken(self, error: BaseException) -> bool:
        """Did a collective fail (its backend's error, or a rank rank 0 started is gone)? Then the
        ranks are out of step for good; any other error is the engine's, which recover() mends."""
        return isinstance(error, (dist.DistError, ConnectionError)) or any(p.poll() is not None for p in self.procs) \
            or any(word in str(error) for word in ("gloo", "NCCL", "Connection"))

    def fail(self, error: BaseException) -> RuntimeError:
        """A collective failed on rank 0: name the cause, stop every rank, refuse later calls. A
        rank's socket closes a moment before its exit status exists: wait a second for it."""
        deadline = time.monotonic() + 1
        while not any(p.poll() is not None for p in self.procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        dead = [f"rank {r} exited with code {p.returncode}" for r, p in enumerate(self.procs, 1)
                if p.poll() is not None]
        why = "; ".join(dead) or f"a rank did not answer within {self.timeout_s:g} s or failed ({first_line(error)})"
        self.failure = f"this tensor-parallel engine is unusable: {why}"
        self.close(graceful=False)
        return RuntimeError(self.failure)

    def close(self, graceful: bool = True) -> None:
        """Rank 0: tell the followers to stop, wait for them, kill what is left; every rank:
        leave the process groups (a later engine in this process starts new ones)."""
        if graceful and self.driver and self.failure is None:
            try:
                self.send("stop")
            except RuntimeError:                 # a follower is gone already
                pass
        deadline = time.monotonic() + (STOP_TIMEOUT_S if graceful else 0)
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if dist.is_initialized():
            dist.destroy_process_group()


def launched_rank(size: int) -> tuple[int, int] | None:
    """(rank, local rank) when a launcher started this process as one of `size` ranks, else None."""
    if "RANK" not in os.environ:
        return None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != size:
        raise ValueError(f"tensor_parallel_size={size}, but the launcher started {world} ranks (WORLD_SIZE)")
    return int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))


def start(size: int, device: str, timeout_s: float, model: str, options: dict, detokenize: bool) -> TensorParallel:
    """Join (under a launcher) or create (rank 0 of a plain process) the engine's process groups.
    On GPUs rank r uses cuda:<local rank>. Returns after every rank has joined."""
    if dist.is_initialized():
        raise RuntimeError("this process is already in a process group: one tensor-parallel engine "
                           "per process (shutdown() the other first)")
    launched, procs = launched_rank(size), []
    if launched is None:                         # rank 0 starts the others, as a launcher would
        rank = local = 0
        address = ("127.0.0.1", free_port())
        procs = [spawn_rank(r, size, address, model, options, detokenize) for r in range(1, size)]
    else:
        rank, local = launched
        address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    if device.startswith("cuda"):
        device = f"cuda:{local}"
        torch.cuda.set_device(device)       # what this rank allocates or syncs by default is its own GPU
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    try:
        # One TCP store, served by rank 0: the process groups' rendezvous, then the mailbox.
        store = dist.TCPStore(address[0], address[1], size, is_master=rank == 0,
                              timeout=timedelta(seconds=START_TIMEOUT_S))
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", store=dist.PrefixStore("pg", store),
                                rank=rank, world_size=size, timeout=timedelta(seconds=timeout_s))
        store.set_timeout(IDLE_FOREVER)
        return TensorParallel(rank, size, device, timeout_s, store, procs)
    except BaseException:
        for proc in procs:
            proc.kill()
        raise


def spawn_rank(rank: int, size: int, address: tuple[str, int], model: str, options: dict,
               detokenize: bool) -> subprocess.Popen:
    """Rank `rank` as its own interpreter, `python -m <phase>.rank`, with a launcher's environment."""
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank),
           "MASTER_ADDR": address[0], "MASTER_PORT": str(address[1])}
    spec = json.dumps({"model": model, "options": options, "detokenize": detokenize})
    return subprocess.Popen([sys.executable, "-m", f"{__package__}.rank", spec], env=env,
                            preexec_fn=die_with_parent)


def die_with_parent() -> None:
    """In the child, before exec: the kernel sends SIGKILL when its parent dies (Linux prctl
    PR_SET_PDEATHSIG), so no rank outlives the process that started it."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def uninterrupted():
    """Hold a Ctrl-C (SIGINT) until the block ends, then raise it. A tensor-parallel step is a
    sequence of collectives every rank must run; cut in half on rank 0, the others would wait in
    a collective rank 0 never enters. So an interrupt lands between steps (as it does in an engine
    whose steps run in another process). Only the main thread receives signals; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    previous = signal.signal(signal.SIGINT, lambda *_: held.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        raise KeyboardInterrupt
