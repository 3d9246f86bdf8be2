"""Sequence: one request's state from prompt to finish (torch-free)."""
from __future__ import annotations

from enum import Enum
from typing import Callable

from common.sampling import SamplingParams


class Status(Enum):
    WAITING = "waiting"      # queued (new, or preempted for recompute), owns no KV blocks
    RUNNING = "running"      # admitted: its KV lives in the blocks of block_table (a prompt may be
                             # partly prefilled: num_computed_tokens < num_tokens)
    SWAPPED = "swapped"      # preempted by swap: its KV waits in host memory, owns no KV blocks
    FINISHED = "finished"    # done, blocks returned to the pool


class Sequence:
    def __init__(self, seq_id: int, prompt_ids: list[int], params: SamplingParams, arrival_time: float,
                 priority: int = 0):
        self.seq_id = seq_id
        self.priority = priority             # lower runs first; equal priorities in arrival order
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.arrival_time = arrival_time
        self.output_ids: list[int] = []
        self.token_times: list[float] = []
        self.finish_reason: str | None = None
        self.stop_text: str | None = None   # text cut before a stop string, when one matched
        self.status = Status.WAITING
        self.block_table: list[int] = []    # KV block ids; token i lives in block_table[i // block_size]
        # Tokens whose K/V is in the pool, counting those of the step just planned (the scheduler
        # advances it when it plans a step). 0 when waiting; a decode keeps it one behind num_tokens.
        self.num_computed_tokens = 0
        self.num_cached_tokens: int | None = None   # prompt tokens found in the prefix cache at its
                                                    # first admission (None until admitted)
        self.num_overtaken = 0              # later arrivals admitted before it (cache-aware admission)
        self._block_keys: list[tuple[int, ...]] = []
        # Tokens a proposer drafted after the newest one, for this step to verify: token_ids_from()
        # feeds them after the real tokens; never output_ids (speculator.py keeps or drops them).
        self.draft_ids: list[int] = []

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_pending_tokens(self) -> int:
        """Tokens whose K/V is still to compute: 1 for a decode, the rest of the prompt mid-prefill,
        and after a recompute preemption the prompt and every token generated so far."""
        return self.num_tokens - self.num_computed_tokens

    def token_ids_from(self, start: int) -> list[int]:
        """Tokens at positions [start, num_tokens): what a step computing them feeds in (a decode's
        one newest token without copying the history before it)."""
        n = len(self.prompt_ids)
        return (self.output_ids[start - n:] if start >= n else self.prompt_ids[start:] + self.output_ids) + self.draft_ids

    def block_keys(self, block_size: int) -> list[tuple[int, ...]]:
        """The token ids of each full block, as tuples (the prefix cache's keys); each one is
        built once, the first time it is asked for."""
        done = len(self._block_keys) * block_size
        new = self.token_ids_from(done)[:self.num_tokens - done]        # real tokens: never a draft
        self._block_keys += [tuple(new[i:i + block_size]) for i in range(0, len(new) - block_size + 1, block_size)]
        return self._block_keys

    @property
    def rank(self) -> tuple[int, int]:
        """Scheduling order: lower priority value first, then earlier arrival (ids grow with it)."""
        return self.priority, self.seq_id

    @property
    def max_len(self) -> int:
        return len(self.prompt_ids) + self.params.max_tokens

    @property
    def last_token(self) -> int:
        """The token a decode step feeds in: the newest one, whose K/V is not cached yet."""
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, token: int, now: float, eos_ids: list[int], decode: Callable[[list[int]], str]) -> None:
        """Record a new token and decide whether the request is done."""
        self.output_ids.append(token)
        self.token_times.append(now)
        if token in eos_ids and not self.params.ignore_eos:
            self.finish_reason = "stop"
        elif self.params.stop and self._hit_stop_string(decode):
            self.finish_reason = "stop"
        elif len(self.output_ids) >= self.params.max_tokens:
            self.finish_reason = "length"

    def _hit_stop_string(self, decode) -> bool:
        text = decode(self.output_ids)
        cuts = [text.find(s) for s in self.params.stop if s in text]
        if cuts:
            self.stop_text = text[:min(cuts)]
        return bool(cuts)
