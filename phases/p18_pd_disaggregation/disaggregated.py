"""Prefill/decode disaggregation: the decode instance (D) and the prefill instance (P) it starts.

Each is a whole engine (LLM) with its own KV pool, in its own process (on two GPUs: its own
GPU). The user talks to D. A request's life:

  D: add  -- ("add", id, prompt, params) -->  P: queued, prefilled (chunked, prefix-cached),
                                                 samples the first token, gathers the prompt's
                                                 blocks into one tensor (kv_connector.py)
  D: reserve blocks, start the receive  <-- ("first", id, token, meta, ...) + the K/V --  P: its
     blocks are free at once (full ones stay in its prefix cache for the next prompt that shares them)
  D: the K/V landed: the request joins D's running batch with its first token; D decodes it

Messages go through the pair's TCP store (two mailboxes: D -> P, P -> D), the K/V through the
connector. A request that ends with its first token (max_tokens=1, EOS, a stop string) comes back
with no K/V. P runs each request with max_tokens=1 and sends the first token's generator state,
so a seeded request continues on D with the random numbers it would have drawn colocated.

Faults. An abort reaches P (queued or prefilling there: its blocks are freed) or frees D's blocks
(a transfer in flight is first completed into them: a channel stays in order). P that dies, hangs
past distributed_timeout_s or fails a request ends the step with an error naming it; its requests
are aborted on D (blocks freed) and the next call starts a new P. P dies with D (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import os
import pickle
import time
from collections import deque
from dataclasses import dataclass, replace
from datetime import timedelta

import torch
import torch.distributed as dist

from .kv_connector import DECODE_RANK, PREFILL_RANK, backend_for, make_connector
from .parallel_state import START_TIMEOUT_S, free_port, spawn_rank, uninterrupted
from .sequence import Sequence, Status

WAIT_SLICE_S = 0.001       # a mailbox wait polls the store this often
POLL_S = 0.05              # an idle side checks its mailbox (and its peer's life) this often
ACK_GRACE_S = 1.0          # P's check waits this long for D's acknowledgements of what it sent last
KEPT_TIMELINES = 4096      # D keeps the last requests' prefill / transfer times (the bench reads them)


class Mailbox:
    """One direction of host messages through the store, in order; sending never waits."""

    def __init__(self, store, name: str):
        self.store, self.name, self.sent, self.read = store, name, 0, 0

    def send(self, *message) -> None:
        self.store.set(f"{self.name}/{self.sent}", pickle.dumps(message))
        self.sent += 1

    def ready(self) -> bool:
        return self.store.check([f"{self.name}/{self.read}"])

    def wait(self, timeout_s: float) -> bool:
        """Is a message there within timeout_s? (Polled: the store's own timed wait logs each timeout.)"""
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if time.monotonic() > deadline:
                return False
            time.sleep(WAIT_SLICE_S)
        return True

    def receive(self) -> tuple:
        key = f"{self.name}/{self.read}"
        message = pickle.loads(self.store.get(key))
        self.store.delete_key(key)
        self.read += 1
        return message


@dataclass
class First:
    """P's answer for one request: its first token, and what D needs to continue it."""
    seq_id: int
    token: int
    meta: object                 # the connector's, when K/V follows; None: it ended on P
    generator_state: object      # a seeded request's RNG after the first draw, else None
    cached: int                  # prompt tokens P found in its prefix cache
    prefilled_at: float          # when P sampled it (time.perf_counter: one clock per host)


def prefill_device(device: str) -> str:
    """Where P runs: the second GPU when there is one, else D's device (one GPU: CUDA IPC)."""
    if device.startswith("cuda") and torch.cuda.device_count() > 1:
        return "cuda:1"
    return device


def start(llm, model: str, options: dict, detokenize: bool):
    """On D: start P and return D's side. In P (started with RANK set): return P's side."""
    if "RANK" in os.environ:
        return PrefillSide(llm)
    return DecodeSide(llm, model, options, detokenize)


def join(rank: int, address: tuple[str, int], backend: str, timeout_s: float, decode_waits_for=None):
    """The pair's store (served by D) and process group. D first waits for P's "ready" (P has
    built its engine) while watching that P lives, so a P that fails to start is an error, not a wait."""
    store = dist.TCPStore(address[0], address[1], 2, is_master=rank == DECODE_RANK,
                          timeout=timedelta(seconds=START_TIMEOUT_S), wait_for_workers=False)
    if rank == PREFILL_RANK:
        store.set("ready", "1")
    else:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not store.check(["ready"]):
            if decode_waits_for.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the prefill instance failed to start (exit code {decode_waits_for.poll()})")
            time.sleep(POLL_S)
    dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=rank, world_size=2,
                            timeout=timedelta(seconds=timeout_s))
    return store


class PrefillSide:
    """In P: take D's requests, prefill them, send each one's first token and K/V to D."""

    def __init__(self, llm):
        self.llm = llm
        if llm.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(llm.device).index or 0)   # "cuda" names no index
        decode = os.environ["DECODE_DEVICE"]
        address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
        store = join(PREFILL_RANK, address, backend_for(decode, llm.device), llm.config.distributed_timeout_s)
        self.inbox, self.outbox = Mailbox(store, "to-p"), Mailbox(store, "to-d")
        self.connector = make_connector(PREFILL_RANK, decode, llm.device, llm.dtype)
        self.more: dict[int, bool] = {}          # seq_id -> does D decode past the first token?
        self.check_due: float | None = None      # D asked for a check: answer once acks are in, or then

    def serve(self) -> None:
        """P's loop, until D says stop: D's messages between steps, a step when there is work."""
        while True:
            if not self.llm.has_unfinished():
                self.inbox.wait(POLL_S)
            while self.inbox.ready():
                message = self.inbox.receive()
                if message[0] == "stop":
                    return dist.destroy_process_group()
                self._apply(*message)
            if self.check_due is not None and (not self.connector.held or time.monotonic() > self.check_due):
                self._check()
            if self.llm.has_unfinished():
                self._step()

    def _apply(self, kind: str, *args) -> None:
        llm = self.llm
        if kind == "add":
            seq_id, ids, params, arrival, priority = args
            try:                                   # P prefills and samples the first token only
                llm._add(Sequence(seq_id, ids, replace(params, max_tokens=1), arrival, priority))
                self.more[seq_id] = params.max_tokens > 1
            except ValueError as e:                # P's pool is smaller than D's
                self.outbox.send("failed", [seq_id], str(e))
        elif kind == "abort":
            llm.abort_request(args[0])
            self.more.pop(args[0], None)
        elif kind == "ack":
            self.connector.release(args[0])
        elif kind == "reset":
            llm.reset_prefix_cache()
        elif kind == "check":                  # K/V D has not read yet is acknowledged meanwhile
            self.check_due = time.monotonic() + ACK_GRACE_S

    def _check(self) -> None:
        self.check_due = None
        try:
            self.llm.check()
            assert not self.connector.held, f"K/V of requests {sorted(self.connector.held)} never acknowledged"
            self.outbox.send("checked", None)
        except AssertionError as e:
            self.outbox.send("checked", f"{e}")

    def _step(self) -> None:
        try:
            self.llm._step()                       # prefilled() runs inside, before blocks are freed
        except Exception as e:                     # noqa: BLE001 - the requests fail, P lives on
            ids = list(self.llm.requests)
            self.llm._abort(list(self.llm.requests.values()))
            self.llm.recover()
            self.outbox.send("failed", ids, f"{type(e).__name__}: {e}")

    def prefilled(self, seqs: list[Sequence]) -> None:
        """After a step sampled these sequences' tokens, before their blocks are freed: each one
        finished (on P every request ends with its first token) goes to D."""
        for seq in seqs:
            if seq.finished:
                self._hand_over(seq)

    def _hand_over(self, seq: Sequence) -> None:
        follows = self.more.pop(seq.seq_id) and seq.finish_reason == "length"   # not EOS or a stop string
        # The prompt's blocks, the partial last one included (its slots past the prompt are junk
        # that D's first decode overwrites): (num_layers, 2, n, block_size, kv_heads, head_dim).
        meta = self.connector.send(seq.seq_id, self.llm.cache.gather(seq.block_table)) if follows else None
        generator = self.llm.generators[seq.seq_id]
        self.outbox.send("first", First(seq.seq_id, seq.output_ids[0], meta,
                                        generator.get_state() if generator is not None else None,
                                        seq.num_cached_tokens or 0, seq.token_times[0]))


class DecodeSide:
    """In D: send requests to P, receive their first tokens and K/V, hand them to D's scheduler."""

    def __init__(self, llm, model: str, options: dict, detokenize: bool):
        if dist.is_initialized():
            raise RuntimeError("this process is already in a process group: one disaggregated engine per "
                               "process (shutdown() the other first)")
        self.llm, self.spec = llm, (model, options, detokenize)
        self.timeout_s = llm.config.distributed_timeout_s
        self.timeline: dict[int, dict] = {}        # seq_id -> prefill / transfer times (bench)
        self.failure: str | None = None
        self.proc = None
        self._start()

    def _start(self) -> None:
        """Spawn P (`python -m <phase>.rank`, as p16 starts a rank) and join it."""
        model, options, detokenize = self.spec
        device = prefill_device(self.llm.device)
        options = options | {"device": device, "cuda_graph": False}   # P never decodes: no graphs
        address = ("127.0.0.1", free_port())
        os.environ["DECODE_DEVICE"] = self.llm.device           # inherited by P
        self.proc = spawn_rank(PREFILL_RANK, 2, address, model, options, detokenize)
        try:
            store = join(DECODE_RANK, address, backend_for(self.llm.device, device), self.timeout_s, self.proc)
            self.outbox, self.inbox = Mailbox(store, "to-p"), Mailbox(store, "to-d")
            self.connector = make_connector(DECODE_RANK, self.llm.device, device, self.llm.dtype)
        except BaseException:
            self.close(graceful=False)
            raise
        self.remote: dict[int, Sequence] = {}     # sent to P, no first token yet
        self.arrivals: deque[First] = deque()     # first tokens read, blocks not yet reserved
        self.transfers: deque = deque()           # (seq, First, Transfer): K/V on its way, in order
        self.failure = None

    # --- the engine's hooks -------------------------------------------------------------------
    def submit(self, seq: Sequence) -> None:
        self.remote[seq.seq_id] = seq
        self.outbox.send("add", seq.seq_id, seq.prompt_ids, seq.params, seq.arrival_time, seq.priority)

    def has_unfinished(self) -> bool:
        return bool(self.remote or self.transfers or any(f.seq_id in self.remote for f in self.arrivals))

    def holders(self) -> list[Sequence]:
        """Sequences holding D's blocks outside the scheduler: those whose K/V is on its way."""
        return [seq for seq, _, _ in self.transfers]

    def ensure_started(self) -> None:
        """Before a call: after P failed, start a new one."""
        if self.failure is not None:
            self._start()

    def step(self) -> list[tuple[int, object]]:
        """D's step: what P sent lands first (requests that ended on P come back at once), then
        D's own step over its running batch. While D has nothing to compute, wait for P."""
        if self.failure is not None:
            raise RuntimeError(self.failure)
        try:
            with uninterrupted():              # a Ctrl-C between reading P's message and acting on it
                done = self._poll(idle=not self.llm.scheduler.has_unfinished())   # would lose a transfer
        except (RuntimeError, ConnectionError, TimeoutError) as e:
            if isinstance(e, PrefillFailed):
                raise
            raise self.fail(e) from e
        return done + self.llm._step()

    def drop(self, seq: Sequence) -> None:
        """Abort seq wherever it is on the way (the engine then frees D's blocks)."""
        if self.remote.pop(seq.seq_id, None) is not None and self.failure is None:
            self.outbox.send("abort", seq.seq_id)     # queued or prefilling on P: P frees its blocks
        for entry in list(self.transfers):
            if entry[0] is seq:
                self.transfers.remove(entry)
                try:                              # complete it, then its blocks can be given back
                    if self.failure is None:
                        entry[2].wait(self.timeout_s)
                        entry[2].land()
                        self.outbox.send("ack", seq.seq_id)
                except (RuntimeError, ConnectionError, TimeoutError) as e:
                    self.fail(e)                  # P is gone: nothing more arrives

    def check_prefill(self) -> None:
        """P's block accounting (tests call it after every call, through LLM.check())."""
        if self.failure is not None:
            return
        self.outbox.send("check")
        deadline = time.monotonic() + self.timeout_s
        while True:
            if not self.inbox.wait(POLL_S):
                self._check_alive(deadline)
                continue
            message = self.inbox.receive()
            if message[0] == "checked":
                assert message[1] is None, f"prefill instance: {message[1]}"
                return
            self._read(message)
            self._reserve()                        # (idle: only aborted requests' K/V, drained and acknowledged)

    def reset_prefix_cache(self) -> None:
        if self.failure is None:
            self.outbox.send("reset")

    # --- what P sent ----------------------------------------------------------------------------
    def _poll(self, idle: bool) -> list:
        self._check_alive()
        if idle and self.remote and not self.arrivals and not self.transfers:
            self._wait_message()
        while self.inbox.ready():
            self._read(self.inbox.receive())
        done = self._reserve()
        if idle and self.transfers and not done:
            self.transfers[0][2].wait(self.timeout_s)
        self._land()
        return done

    def _read(self, message: tuple) -> None:
        if message[0] == "first":
            self.arrivals.append(message[1])
        elif message[0] == "failed":
            ids, why = message[1], message[2]
            for seq_id in ids:
                self.remote.pop(seq_id, None)
            raise PrefillFailed(f"the prefill instance failed request(s) {ids}: {why}")

    def _wait_message(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not self.inbox.wait(POLL_S):
            self._check_alive(deadline)

    def _check_alive(self, deadline: float | None = None) -> None:
        if self.proc.poll() is not None:
            raise ConnectionError(f"exited with code {self.proc.returncode}")
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"did not answer within {self.timeout_s:g} s")

    def _reserve(self) -> list:
        """In P's order: reserve blocks and start each K/V's receive; finish requests that ended
        on P. A request whose blocks are not free yet waits, and the ones behind it too."""
        bm, done = self.llm.scheduler.block_manager, []
        while self.arrivals:
            first = self.arrivals[0]
            seq = self.remote.get(first.seq_id)
            if seq is None:                        # aborted meanwhile
                if first.meta is not None:
                    self.connector.discard(first.seq_id, first.meta)
                    self.outbox.send("ack", first.seq_id)
            elif first.meta is None:               # it ended with its first token
                done.append(self._end_on_prefill(seq, first))
            else:
                n = bm.blocks_for(len(seq.prompt_ids))
                if not bm.can_allocate(n):
                    break
                bm.allocate(seq, n)
                self.transfers.append((seq, first, self.connector.recv(seq.seq_id, first.meta,
                                                                      self.llm.cache, seq.block_table)))
                self._record(seq, first, "arrived")
            self.arrivals.popleft()
            self.remote.pop(first.seq_id, None)
        return done

    def _land(self) -> None:
        """Transfers that completed, in order, while D has seats: their requests start decoding."""
        scheduler = self.llm.scheduler
        while self.transfers and self.transfers[0][2].ready() and len(scheduler.running) < scheduler.max_num_seqs:
            seq, first, transfer = self.transfers.popleft()
            transfer.land()
            self.outbox.send("ack", seq.seq_id)          # P drops its copy
            seq.num_computed_tokens = len(seq.prompt_ids)     # the prompt's K/V is in D's blocks
            self._first_token(seq, first)
            seq.status = Status.RUNNING
            scheduler.running.append(seq)
            self._record(seq, first, "landed")

    def _first_token(self, seq: Sequence, first: First) -> None:
        llm = self.llm
        seq.num_cached_tokens = first.cached
        seq.append(first.token, time.perf_counter(), llm.source.eos_token_ids, llm._detokenize)
        if first.generator_state is not None:
            llm.generators[seq.seq_id].set_state(first.generator_state)

    def _end_on_prefill(self, seq: Sequence, first: First) -> tuple[int, object]:
        self._first_token(seq, first)
        assert seq.finished, "the prefill instance ended a request that continues here"
        seq.status = Status.FINISHED
        return self.llm._retire([seq])[0]

    def _record(self, seq: Sequence, first: First, event: str) -> None:
        times = self.timeline.setdefault(seq.seq_id, {"arrival": seq.arrival_time, "prefilled": first.prefilled_at,
                                                       "cached": first.cached})
        times[event] = time.perf_counter()
        if len(self.timeline) > KEPT_TIMELINES:
            del self.timeline[next(iter(self.timeline))]

    # --- faults ----------------------------------------------------------------------------------
    def fail(self, error: BaseException) -> RuntimeError:
        """P died, hangs, or its link broke: stop it, forget what was on its way (the engine's
        recover() then aborts those requests and frees their blocks), and say which."""
        if self.proc.poll() is None:               # a dying P's socket closes a moment before it exits
            time.sleep(0.2)
        why = f"exited with code {self.proc.returncode}" if self.proc.poll() is not None else str(error)
        self.failure = f"the prefill instance {why} (the next call starts a new one)"
        if self.llm.device.startswith("cuda"):
            torch.cuda.synchronize()               # no copy into D's blocks is left running
        self.close(graceful=False)
        return RuntimeError(self.failure)

    def close(self, graceful: bool = True) -> None:
        if graceful and self.failure is None and self.proc.poll() is None:
            try:
                self.outbox.send("stop")
                self.proc.wait(10)
            except Exception:                          # noqa: BLE001 - killed below
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if dist.is_initialized():
            dist.destroy_process_group()


class PrefillFailed(RuntimeError):
    """P failed some requests (its own step raised, or a prompt does not fit its pool): they end
    with this error; P lives on."""
