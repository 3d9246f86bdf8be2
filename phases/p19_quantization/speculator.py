"""Speculator: drafts ride on a step's decode rows, and the target verifies them in that step.

A decode step reads every weight once whatever its rows, so while that read (or the host) bounds
it, scoring k + 1 tokens of a sequence costs about what scoring one does. Per step:
  draft     after the scheduler's plan, each decode (its one new token is an output) gets up to k
            tokens from the proposer, blocks grown for them: a chunk of positions [L - 1, L + k)
            on the prefill-chunk path, over the paged pool.
  verify    all k + 1 rows give logits (row j predicts the token after row j's): the drafts that
            agree are kept, up to the first that does not, plus one target token (sampler.py).
  rollback  a sequence that kept a of k drafts has L + a + 1 tokens and right K/V for L + a (a
            kept draft's K/V came from that very token). The computed length drops to that, which
            drops the rejected slots, and blocks that begin past the new length are freed. The
            newest token is pending, as after any decode: the next step writes its K/V.
The switch: no drafts in a step that decodes more than speculative_disable_by_batch_size
sequences (vLLM's rule and name): there many rows share the weights' read already and a verify's
extra rows cost compute and host work per sequence. Nor where the step's budget or the pool has no
room, or max_tokens leaves nothing to verify. Counters as vLLM names them (drafts, draft tokens,
accepted tokens, per position), and decode rows and their tokens (tokens per target step).
"""
from __future__ import annotations

import torch

from .block_manager import BlockManager
from .proposers import Draft, NgramProposer, Proposer
from .sampler import verify, verify_greedy
from .scheduler import StepPlan
from .sequence import Sequence


class Speculator:
    def __init__(self, proposer: Proposer, k: int, max_batch: int, block_manager: BlockManager):
        self.proposer, self.k, self.max_batch, self.block_manager = proposer, k, max_batch, block_manager
        self.draft_probs: dict[int, torch.Tensor | None] = {}      # seq_id -> q of this step's drafts
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * k
        self.num_decode_rows = self.num_decode_tokens = 0   # sequence-steps that decoded, tokens they gave
        self.decoding: set[int] = set()         # this step's decodes (seq ids)

    def draft(self, plan: StepPlan) -> list[int]:
        """Give the plan's decodes their drafts (when the switch allows); the rows each sequence
        scores: 1, or 1 + its drafts."""
        decodes = [i for i, (seq, n) in enumerate(zip(plan.seqs, plan.num_new_tokens))
                   if n == 1 and seq.output_ids and seq.num_pending_tokens == 0]
        self.decoding = {plan.seqs[i].seq_id for i in decodes}
        if 0 < len(decodes) <= self.max_batch:
            for i, d in zip(decodes, self.proposer.propose([plan.seqs[i] for i in decodes], self.k)):
                self._attach(plan, i, d)
            plan.is_prefill = any(n > 1 for n in plan.num_new_tokens)
        return [1 + len(seq.draft_ids) for seq in plan.seqs]

    def _attach(self, plan: StepPlan, i: int, draft: Draft) -> None:
        seq = plan.seqs[i]
        room = min(self.k, seq.params.max_tokens - len(seq.output_ids) - 1, plan.budget_left)
        ids = draft.token_ids[:max(0, room)]
        if not ids or not self.block_manager.can_grow(seq, seq.num_computed_tokens + len(ids)):
            return
        self.block_manager.grow(seq, seq.num_computed_tokens + len(ids))
        seq.draft_ids = ids
        seq.num_computed_tokens += len(ids)
        plan.num_new_tokens[i] += len(ids)
        plan.num_batched_tokens += len(ids)          # a counter, not a sum: the budget left shrinks
        self.draft_probs[seq.seq_id] = None if draft.probs is None else draft.probs[:len(ids)]

    def verify(self, seqs: list[Sequence], logits: torch.Tensor, spans: list[tuple[int, int]],
               generators: list) -> list[list[int] | None]:
        """Each drafted sequence's kept drafts and one more token, from its rows [a, b) of logits
        (R, vocab); None for a sequence without drafts (the plain sampler's)."""
        out: list[list[int] | None] = [None] * len(seqs)
        greedy = [i for i, seq in enumerate(seqs) if seq.draft_ids and seq.params.greedy]
        if greedy:                               # one argmax and one host copy for every greedy verify
            targets = iter(logits[[r for i in greedy for r in range(*spans[i])]].argmax(-1).tolist())
            for i in greedy:
                out[i] = verify_greedy([next(targets) for _ in range(*spans[i])], seqs[i].draft_ids)
        for i, seq in enumerate(seqs):
            if seq.draft_ids and not seq.params.greedy:
                out[i] = verify(logits[spans[i][0]:spans[i][1]], seq.draft_ids, self.draft_probs.get(seq.seq_id),
                                seq.params, generators[i])
        return out

    def rollback(self, seq: Sequence, num_new: int) -> None:
        """After a step gave seq num_new tokens (its kept drafts and one more; fewer were appended
        if one of them finished it): count them, drop the drafts, keep the K/V of its real tokens
        only (the newest is pending), and free the blocks that begin past its length."""
        if seq.draft_ids:
            self.count(len(seq.draft_ids), num_new - 1)
        if seq.seq_id in self.decoding:
            self.num_decode_rows += 1
            self.num_decode_tokens += num_new
        seq.draft_ids = []
        self.draft_probs.pop(seq.seq_id, None)
        seq.num_computed_tokens = seq.num_tokens - 1
        self.block_manager.truncate(seq, seq.num_tokens)

    def count(self, drafted: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        for j in range(accepted):
            self.accepted_per_pos[j] += 1

    def release(self, seq: Sequence) -> None:
        seq.draft_ids = []
        self.draft_probs.pop(seq.seq_id, None)
        self.proposer.release(seq)

    def rebuild(self) -> None:
        """After a failure, every request aborted (engine.recover): no drafts in flight; a
        proposer of ours rebuilds what it keeps per sequence (a draft model's pool)."""
        self.draft_probs.clear()
        self.decoding.clear()
        if isinstance(self.proposer, Proposer):        # (a benchmark's own keeps nothing to rebuild)
            self.proposer.rebuild()

    def check(self, live: set[int]) -> None:
        """Raise AssertionError where the proposer's accounting is not whole, or it keeps state
        for a request that is gone (live: the engine's unfinished request ids)."""
        assert set(self.draft_probs) <= live, "drafts kept for a request that is gone"
        if isinstance(self.proposer, Proposer):
            self.proposer.check(live)

    def counters(self) -> dict:
        return {"spec_decode_num_drafts": self.num_drafts, "spec_decode_num_draft_tokens": self.num_draft_tokens,
                "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
                "spec_decode_num_accepted_tokens_per_pos": list(self.accepted_per_pos),
                "decode_rows": self.num_decode_rows, "decode_tokens": self.num_decode_tokens}


def make_speculator(engine) -> Speculator:
    c = engine.config
    if c.speculative == "ngram":
        proposer = NgramProposer(c.prompt_lookup_min, c.prompt_lookup_max)
    elif c.speculative == "draft":
        from .draft_proposer import DraftModelProposer
        proposer = DraftModelProposer(engine, c.draft_num_layers)
    else:
        proposer = Proposer()                                      # off: nothing is ever drafted
    max_batch = c.speculative_disable_by_batch_size if c.speculative else 0
    return Speculator(proposer, c.num_speculative_tokens, max_batch, engine.scheduler.block_manager)
