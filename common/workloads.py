"""The benchmark workloads as (prompt ids, SamplingParams) lists.

Prompts are random token ids (seeded), outputs are forced to their length with ignore_eos, and
decoding is greedy so every engine does identical work and can be compared token for token.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from .sampling import SamplingParams

# Requests per scale for the offline workload; "small" keeps the distributions.
OFFLINE_REQUESTS = {"full": 256, "small": 16}
# Repeats per workload and scale: each repeat runs every engine of a comparison once, in turn.
REPEATS = {"latency": {"full": 5, "small": 2}, "concurrency": {"full": 3, "small": 2},
           "offline": {"full": 3, "small": 2}}
CONCURRENCY_LENS = {"full": (512, 256), "small": (64, 32)}   # (prompt, output) tokens per request
PROMPT_ID_RANGE = 10_000   # ids drawn from [0, 10000), valid for every preset's vocab


@dataclass
class Workload:
    name: str
    requests: list[tuple[list[int], SamplingParams]]

    @property
    def prompts(self) -> list[list[int]]:
        return [ids for ids, _ in self.requests]

    @property
    def params(self) -> list[SamplingParams]:
        return [p for _, p in self.requests]

    @property
    def output_tokens(self) -> int:
        return sum(p.max_tokens for p in self.params)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.prompts)


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def latency(prompt_len: int = 32, max_tokens: int = 256, seed: int = 0) -> Workload:
    """Batch 1: one 32-token prompt, 256 new tokens."""
    rng = random.Random(seed)
    ids = [rng.randrange(PROMPT_ID_RANGE) for _ in range(prompt_len)]
    return Workload("latency", [(ids, greedy(max_tokens))])


def offline(scale: str = "full", lo: int = 100, hi: int = 1024, seed: int = 0,
            num_requests: int | None = None) -> Workload:
    """N requests, prompt and output lengths uniform in [lo, hi] (the nano-vllm benchmark).
    N is the scale's count unless num_requests is given; the first N requests of a larger set are
    the smaller set, so runs of different sizes share their prefix."""
    rng = random.Random(seed)
    requests = []
    for _ in range(num_requests or OFFLINE_REQUESTS[scale]):
        prompt = [rng.randrange(PROMPT_ID_RANGE) for _ in range(rng.randint(lo, hi))]
        requests.append((prompt, greedy(rng.randint(lo, hi))))
    return Workload("offline", requests)


def concurrency(c: int, scale: str = "full", seed: int = 0, prompt_len: int | None = None) -> Workload:
    """Exactly c requests of identical lengths (prompt 512, output 256), submitted together: the
    throughput of an engine with c requests in flight. Same prompts for every engine and seed.
    prompt_len replaces the scale's prompt length (long contexts); the output length stays."""
    standard_len, max_tokens = CONCURRENCY_LENS[scale]
    prompt_len = prompt_len or standard_len
    rng = random.Random(seed)
    return Workload("concurrency", [([rng.randrange(PROMPT_ID_RANGE) for _ in range(prompt_len)],
                                     greedy(max_tokens)) for _ in range(c)])
