"""Worker process: builds one engine (a whole replica, or one pipeline stage) on its own device and
serves the parent's commands until told to stop. Every failure goes back to the parent as text.

Every command and every reply carries its call's id. The parent publishes the id of the call it
waits for in a shared value (0: none); a worker steps a call only while that id is its own, so a
call the parent gave up on (Ctrl-C, an error) is aborted at the next step, its blocks freed, and
any late reply is told apart from the next call's by its id.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait

import torch
import torch.distributed as dist

from .engine import LLM
from .pipeline import STAGE_ENGINES, TAIL, PipelineHead

STOP = ("stop", 0, None)


@dataclass
class WorkerSpec:
    """What every worker is told at its start: the engine to build and where to meet the others."""
    model: str
    options: dict               # LLM options, with device and dtype already resolved
    parallel: str               # "replica" or "pipeline"
    world_size: int
    port: int                   # the process group's rendezvous on 127.0.0.1 (pipeline only)


def rank_device(device: str, rank: int) -> str:
    """One device per rank: cuda:rank on GPUs; on CPU every rank shares the host."""
    return f"cuda:{rank}" if device.startswith("cuda") else "cpu"


def main(rank: int, spec: WorkerSpec, commands, results, current) -> None:
    """Process entry. Replies on `results`: (kind, rank, call id, payload), kind one of "ready",
    "done", "invalid" (a request it cannot take), "failed" (the call failed, the worker serves on)
    or "error" (the worker is exiting). `current`: the id of the call the parent waits for."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C reaches the whole process group: the
    exit_with_parent()                              # parent decides; its death ends us
    try:
        device = rank_device(spec.options["device"], rank)
        if device == "cpu":                 # the ranks share the cores instead of fighting for them
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.world_size))
        else:                               # this rank's GPU is its current device: nothing it
            torch.cuda.set_device(device)   # makes or syncs by default lands on another rank's GPU
        engine = build(rank, spec, device)
        results.put(("ready", rank, 0, None))
        if spec.parallel == "pipeline" and rank == TAIL:
            engine.serve()                  # driven by the head over send/recv, not by commands
        else:
            serve(engine, commands, results, rank, current)
    except BaseException:                   # noqa: BLE001 - everything goes back to the parent
        results.put(("error", rank, 0, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def exit_with_parent() -> None:
    """End this process as soon as the parent is gone, even SIGKILLed with no chance to stop us.
    The parent holds the write end of a pipe (multiprocessing's parent sentinel): at its death
    the read end here sees end-of-file. A daemon thread waits on it, so a worker blocked in a
    step still exits."""
    sentinel = mp.parent_process().sentinel

    def watch():
        wait([sentinel])
        os._exit(1)
    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def build(rank: int, spec: WorkerSpec, device: str):
    # Inside a worker each engine is an in-process one: the parallel mode is the parent's.
    options = {**spec.options, "device": device, "parallel": "none", "world_size": 1}
    if spec.parallel == "replica":
        return LLM(spec.model, **options)
    init_distributed(rank, spec.world_size, spec.port, device)
    return STAGE_ENGINES[rank](spec.model, **options)


def init_distributed(rank: int, world_size: int, port: int, device: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", rank=rank, world_size=world_size)


def serve(engine, commands, results, rank: int, current) -> None:
    """Run every ("generate", call id, [(index, prompt ids, params, priority), ...]) until STOP. A request this
    engine cannot take (ValueError) or any other failure of one call is reported, and the worker
    keeps serving; a call the parent gave up on gets no reply."""
    while (command := commands.get()) != STOP:
        _, call_id, requests = command
        try:
            outputs = run_call(engine, requests, lambda: current.value == call_id)
        except ValueError as e:
            results.put(("invalid", rank, call_id, str(e)))
        except Exception:                   # noqa: BLE001 - the call failed, the engine is idle again
            results.put(("failed", rank, call_id, traceback.format_exc()))
        else:
            if outputs is not None:
                results.put(("done", rank, call_id, outputs))
    if isinstance(engine, PipelineHead):
        engine.close()                      # the tail's stop signal


def run_call(engine, requests, wanted) -> list | None:
    """Step one call's requests to completion while wanted() (the parent still waits for it).
    Returns their outputs in order, or None if the parent gave up. Whatever happens, the engine
    is idle afterwards: what is left of the call is aborted and its blocks are free."""
    ids, outputs = [], {}
    try:
        for index, *request in requests:    # each is checked as it is added, and named as LLM.generate names it
            try:
                ids.append(engine.add_request(*request))
            except ValueError as e:
                raise ValueError(str(e).replace("the request", f"request {index}", 1)) from None
        while engine.has_unfinished() and wanted():
            outputs.update(engine.step())
    finally:
        abort_all(engine)                   # nothing to do after a call that finished
    return [outputs[i] for i in ids] if len(outputs) == len(ids) else None


def abort_all(engine) -> None:
    """Abort every request the engine holds (all of them belong to the call that just ended)."""
    schedulers = getattr(engine, "groups", [engine.scheduler])     # the pipeline head has two
    engine._abort([seq for s in schedulers for seq in (*s.waiting, *s.running, *s.swapped)])
