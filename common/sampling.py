"""SamplingParams: the per-request decoding knobs, validated at construction and on every change."""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace

# The sampler divides fp32 logits by the temperature; below this, logits / temperature overflows
# to inf for ordinary logits (at 1e-38 a logit of 4 already does) and softmax turns inf into NaN.
# At 1e-5 a logit would need to pass 3e33 to overflow, and sampling is already greedy in all but
# name: a logit gap of 0.001 gives odds of e^100 (vLLM treats temperatures below 1e-5 as greedy).
MIN_TEMPERATURE = 1e-5
SEED_LIMIT = 2**64      # torch.Generator.manual_seed takes a seed in [0, 2**64) (an unsigned 64-bit)
GENERATOR_SEED_BITS = 32  # ...but the CPU generator (mt19937) keeps only the low 32 bits of it


@dataclass
class SamplingParams:
    """What to generate for one request (vLLM-compatible names).

    temperature == 0 means greedy. top_k == 0 (or -1) and top_p == 1 disable those filters.
    stop: strings that end generation; the stop string itself is not part of the text.
    ignore_eos: keep generating past EOS (benchmarks use it to fix output lengths).
    seed: per-request seed; the same seed reproduces the same samples.
    """
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is None:
            self.stop = []
        if not isinstance(self.stop, (list, tuple)):
            raise ValueError(f"stop must be a string or a list of non-empty strings, got {self.stop!r}")
        self.stop = list(self.stop)
        if is_int(self.top_k) and self.top_k == -1:
            self.top_k = 0
        self._validate()
        object.__setattr__(self, "_built", True)

    def __setattr__(self, name: str, value) -> None:
        """A field changed after construction is checked like one passed to it: a copy with the
        new value goes through __post_init__ (ValueError, nothing changed), and its normalized
        value is kept (stop="###" becomes ["###"]). Without this, temperature=nan set later would
        reach the sampler and fail there, mid-run, with torch's "probability tensor contains nan"."""
        if getattr(self, "_built", False) and name in self.__dataclass_fields__:
            value = getattr(replace(self, **{name: value}), name)
        object.__setattr__(self, name, value)

    def _validate(self) -> None:
        """Types first, then ranges: every value is checked here so none can fail mid-run."""
        if not is_int(self.max_tokens) or self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not _is_real(self.temperature) or not (self.temperature == 0.0 or
                                                  MIN_TEMPERATURE <= self.temperature < math.inf):
            raise ValueError(f"temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE:g}, "
                             f"got {self.temperature!r}")
        if not _is_real(self.top_p) or not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if not is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be a non-negative integer (0 or -1 disables it), got {self.top_k!r}")
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed < SEED_LIMIT):
            raise ValueError(f"seed must be None or an integer in [0, 2**64), got {self.seed!r}")

    def validate(self) -> None:
        """Check again (an engine does, as it accepts a request): the stop list can still be
        changed in place, which no __setattr__ sees."""
        self._validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def generator_seed(seed: int) -> int:
    """The seed a request's torch.Generator gets. torch's CPU generator keeps only the low 32 bits
    of its seed, so 0, 2**32 and 2**63 would draw the same samples. Seeds below 2**32 pass as they
    are; a larger seed is hashed, all 64 bits of it, into that range, so seeds that differ only in
    their high bits draw different samples too (two large seeds still share a stream with odds
    2**-32: 2**64 seeds cannot all fit into 2**32 streams)."""
    if seed < 2**GENERATOR_SEED_BITS:
        return seed
    digest = hashlib.blake2b(seed.to_bytes(8, "little"), digest_size=GENERATOR_SEED_BITS // 8).digest()
    return int.from_bytes(digest, "little")


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)     # True is an int to Python, not to us


def _is_real(x) -> bool:
    """An int or float that is not NaN (NaN passes no range check, so it is refused here too)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x
