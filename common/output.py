"""Output: what generate() returns for one request."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Output:
    """One finished request.

    token_times[i] is the host clock (time.perf_counter, seconds) when token i was ready, so
    TTFT = token_times[0] - arrival_time and ITL = diff(token_times).
    finish_reason: "stop" (EOS or a stop string) or "length" (max_tokens).
    """
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    arrival_time: float
    token_times: list[float] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival_time

    @property
    def itl(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]
