"""ParallelLLM: LLM's generate() over worker processes, and the router that spreads requests.

parallel="replica": world_size whole engines, one per device, each with its own scheduler and KV
pool; the router gives each request to the replica with the fewest outstanding tokens and puts
the outputs back in prompt order. parallel="pipeline": the layers over 2 stage processes
(pipeline.py); every request goes to stage 0, which schedules and drives stage 1.

Requests are checked here, before any worker sees them, with the same rules as LLM.
"""
from __future__ import annotations

import dataclasses
import time

from common.loader import resolve
from common.output import Output
from common.requests import prepare_requests

from .config import EngineConfig
from .engine import check_priorities
from .worker_pool import WorkerPool


def least_outstanding_tokens(costs: list[int], num_replicas: int) -> list[list[int]]:
    """Request indices per replica: each request, in order, goes to the replica with the fewest
    tokens (prompt + max new tokens) assigned so far; ties go to the lower rank."""
    load, shares = [0] * num_replicas, [[] for _ in range(num_replicas)]
    for i, cost in enumerate(costs):
        rank = min(range(num_replicas), key=load.__getitem__)
        shares[rank].append(i)
        load[rank] += cost
    return shares


class ParallelLLM:
    """ParallelLLM(model, parallel=..., world_size=..., **options).generate(prompts, params)
    -> list[Output], as LLM's.

    Only generate(): the step API lives inside the workers. A call that fails or is interrupted
    (Ctrl-C) leaves the engine ready for the next; only a dead worker ends it. Stop the workers
    with shutdown() or `with ParallelLLM(...) as llm:`; they also stop when this object is
    collected, at exit, or when this process is killed."""

    runs_in_workers = True   # the model, its memory and its clocks are the workers' (for the bench)

    def __init__(self, model: str = "smollm2-135m", *, detokenize: bool = True, **options):
        self.config = EngineConfig(model=model, **options)     # validated before any process starts
        if self.config.parallel == "none":
            raise ValueError("ParallelLLM needs parallel='replica' or 'pipeline'; "
                             "LLM(...) is the one-process engine")
        self.source = resolve(self.config.model, seed=self.config.seed)
        self.model_config = self.source.config
        self.max_model_len = self.config.resolve_max_model_len(self.model_config.max_position)
        c = self.config
        worker_options = {**options, "device": c.device, "dtype": c.dtype, "detokenize": detokenize}
        self.pool = WorkerPool(c.model, worker_options, c.parallel, c.world_size)
        # Replicas all take requests; a pipeline takes them at stage 0 only.
        self.entry_ranks = list(range(c.world_size)) if c.parallel == "replica" else [0]

    @property
    def tokenizer(self):
        return self.source.tokenizer

    def generate(self, prompts, sampling_params=None, use_tqdm: bool = False,
                 priorities: list[int] | None = None) -> list[Output]:
        """As LLM.generate (use_tqdm is ignored: the work happens in the workers). Each replica,
        or the pipeline's head, schedules its share of the requests by their priorities."""
        now = time.perf_counter()   # offline: every request arrives now
        # encode lazily: token-id prompts need no tokenizer (random presets borrow SmolLM2's)
        requests = prepare_requests(prompts, sampling_params, lambda text: self.tokenizer.encode(text),
                                    self.model_config.vocab_size, self.max_model_len)
        requests = [(*r, pri) for r, pri in zip(requests, check_priorities(priorities, len(requests)))]
        costs = [len(ids) + p.max_tokens for ids, p, _ in requests]
        shares = least_outstanding_tokens(costs, len(self.entry_ranks))
        commands = {rank: ("generate", [(i, *requests[i]) for i in share])    # i names a request that fails
                    for rank, share in zip(self.entry_ranks, shares) if share}
        replies = self.pool.call(commands)
        outputs: list[Output | None] = [None] * len(requests)
        for rank, share in zip(self.entry_ranks, shares):
            for i, out in zip(share, replies.get(rank, [])):
                # perf_counter is the host's monotonic clock, shared by all processes on Linux
                outputs[i] = dataclasses.replace(out, arrival_time=now)
        return outputs

    def shutdown(self) -> None:
        """Stop every worker (idempotent)."""
        self.pool.shutdown()

    def __enter__(self) -> ParallelLLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
