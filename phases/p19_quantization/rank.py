"""python -m <phase>.rank SPEC: rank 1..N-1 of a tensor-parallel engine that rank 0 started.

Rank 0 (LLM(..., tensor_parallel_size=N) in a plain process) starts each other rank as this
module with the environment a launcher such as torchrun would give it (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and SPEC, the engine's arguments as JSON. The rank builds
the same engine, which joins the process groups, and follows rank 0 until it shuts down.
"""
from __future__ import annotations

import json
import os
import signal
import sys

import torch

from .engine import LLM


def main(spec: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # a terminal's Ctrl-C reaches every rank: rank 0 decides
    args = json.loads(spec)
    if "OMP_NUM_THREADS" not in os.environ:        # CPU ranks share the host's cores, not fight for them
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["WORLD_SIZE"])))
    LLM(args["model"], detokenize=args["detokenize"], **args["options"]).follow()


if __name__ == "__main__":
    main(sys.argv[1])
