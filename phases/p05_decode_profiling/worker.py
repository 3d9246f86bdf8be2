"""Worker process: builds one engine (a whole replica, or one pipeline stage) on its own device and
serves the parent's commands until told to stop. Every failure goes back to the parent as text."""
from __future__ import annotations

import os
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .engine import LLM
from .pipeline import STAGES, TAIL, PipelineHead

STOP = ("stop", None)


@dataclass
class WorkerSpec:
    """What every worker is told at spawn: the engine to build and where to meet the others."""
    model: str
    options: dict               # LLM options, with device and dtype already resolved
    parallel: str               # "replica" or "pipeline"
    world_size: int
    port: int                   # the process group's rendezvous on 127.0.0.1 (pipeline only)


def rank_device(device: str, rank: int) -> str:
    """One device per rank: cuda:rank on GPUs; on CPU every rank shares the host."""
    return f"cuda:{rank}" if device.startswith("cuda") else "cpu"


def main(rank: int, spec: WorkerSpec, commands, results) -> None:
    """Process entry. Replies on `results`: ("ready" | "done" | "invalid" | "error", rank, payload)."""
    try:
        device = rank_device(spec.options["device"], rank)
        if device == "cpu":                 # the ranks share the cores instead of fighting for them
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.world_size))
        engine = build(rank, spec, device)
        results.put(("ready", rank, None))
        if spec.parallel == "pipeline" and rank == TAIL:
            engine.serve()                  # driven by the head over send/recv, not by commands
        else:
            serve(engine, commands, results, rank)
    except BaseException:                   # noqa: BLE001 - everything goes back to the parent
        results.put(("error", rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def build(rank: int, spec: WorkerSpec, device: str):
    options = {**spec.options, "device": device}
    if spec.parallel == "replica":
        return LLM(spec.model, **{**options, "parallel": "none", "world_size": 1})
    init_distributed(rank, spec.world_size, spec.port, device)
    return STAGES[rank](spec.model, **options)


def init_distributed(rank: int, world_size: int, port: int, device: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", rank=rank, world_size=world_size)


def serve(engine, commands, results, rank: int) -> None:
    """Run generate() for every ("generate", [(prompt ids, params), ...]) until STOP. A ValueError
    (a request this engine cannot take) is reported and the worker keeps serving."""
    while (command := commands.get()) != STOP:
        _, requests = command
        try:
            outputs = engine.generate([ids for ids, _ in requests], [p for _, p in requests])
        except ValueError as e:
            results.put(("invalid", rank, str(e)))
            continue
        results.put(("done", rank, outputs))
    if isinstance(engine, PipelineHead):
        engine.close()                      # the tail's stop signal
