"""Proposers: who drafts the tokens a verify step checks, behind one small interface.

propose(seqs, k) -> one Draft per sequence: up to k token ids that would follow its newest token,
and the distributions q they were drawn from (None: drafted deterministically, q one-hot). Fewer
than k, or none (that sequence decodes as usual), is fine. release(seq) forgets a sequence;
rebuild() forgets all of them after a failure, check() asserts what it keeps is whole.

  ngram     prompt lookup: the longest suffix of the context (prompt_lookup_max tokens down to
            prompt_lookup_min) found earlier in it; the k tokens after its latest occurrence. No
            model: it pays where the output copies the input (summaries, code edits, quotes).
  draft     a smaller model of the same tokenizer (draft_proposer.py).
A benchmark sets its own as speculator.proposer (common.spec_decode's scripted one).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sequence import Sequence


@dataclass
class Draft:
    token_ids: list[int]
    probs: torch.Tensor | None = None      # (len(token_ids), vocab): q of each draft, or None (deterministic)


class Proposer:
    """The interface (and the proposer of nothing)."""

    def propose(self, seqs: list[Sequence], k: int) -> list[Draft]:
        return [Draft([]) for _ in seqs]

    def release(self, seq: Sequence) -> None:
        pass

    def rebuild(self) -> None:
        """Forget every sequence, after a failure that may have cut an update in half."""

    def check(self, live: set[int]) -> None:
        """Raise AssertionError where what it keeps is not whole (live: unfinished request ids)."""


class NgramProposer(Proposer):
    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n

    def propose(self, seqs: list[Sequence], k: int) -> list[Draft]:
        return [Draft(self.lookup(seq.prompt_ids + seq.output_ids, k)) for seq in seqs]

    def lookup(self, context: list[int], k: int) -> list[int]:
        """The k tokens after the latest earlier occurrence of the context's longest matching
        suffix (max_n tokens down to min_n); [] when none occurs."""
        for n in range(min(self.max_n, len(context) - 1), self.min_n - 1, -1):
            suffix = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):      # latest first, the suffix itself excluded
                if context[start:start + n] == suffix:
                    return context[start + n:start + n + k]
        return []
