"""DraftModelProposer: a smaller model of the same tokenizer drafts k tokens, one decode at a time.

The draft here is the target's own first draft_num_layers layers, final norm and head (a
self-draft: no weights of its own; untrained to exit early, it agrees less often than a trained
small model would, but every line below serves any smaller model of the same vocabulary). It keeps
its own paged KV pool (as many blocks as the target's) and block tables, and runs through the
same ModelRunner. Its pool has as many blocks as the target's (engine.py splits the KV memory
between the two by their layers). Per target step, k forwards over the batch: the first feeds each
sequence's tokens the draft has not seen (the kept drafts and the target's token: a short chunk)
and drafts token 1; each later one feeds the draft just made and drafts the next. No forward
computes more than the target's step budget: where the unseen tokens are more (a whole prompt, the
first time), forwards of at most that budget catch up first. The drafts' own K/V is then
dropped (only real tokens count as seen). A sampled request's drafts are drawn from the draft's
distribution at the request's temperature and filters, with the request's generator; those
distributions go to the rejection sampler as q.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from .block_manager import BlockManager
from .kv_cache import KVCache
from .model import Model
from .model_runner import ModelRunner
from .proposers import Draft, Proposer
from .sampler import probs
from .scheduler import StepPlan
from .sequence import Sequence


class DraftState:
    """What ModelRunner and BlockManager read of a sequence, for the draft's own pool."""

    def __init__(self, seq_id: int):
        self.seq_id, self.tokens, self.block_table, self.num_computed_tokens = seq_id, [], [], 0

    def token_ids_from(self, start: int) -> list[int]:
        return self.tokens[start:]


class DraftModelProposer(Proposer):
    def __init__(self, engine, num_layers: int | None):
        self.model = self_draft(engine.model, draft_depth(engine.model.cfg.num_layers, num_layers))
        cache = KVCache(self.model.cfg, engine.cache.num_blocks, engine.cache.block_size, engine.device, engine.dtype)
        self.blocks = BlockManager(cache.num_blocks, cache.block_size, enable_prefix_caching=False)
        self.runner = ModelRunner(self.model, cache, engine.device, engine.runner.backend)
        self.generators = engine.generators          # seq_id -> the request's RNG (shared with the verify)
        self.tp = engine.tp                          # tensor-parallel process groups, or None
        self.budget = engine.config.max_num_batched_tokens     # tokens one forward may compute
        self.states: dict[int, DraftState] = {}

    def propose(self, seqs: list[Sequence], k: int) -> list[Draft]:
        live = [(seq, st) for seq in seqs if (st := self._state(seq, k)) is not None]
        drafts = {seq.seq_id: ([], []) for seq, _ in live}         # seq_id -> (draft ids, their q)
        self._catch_up([st for _, st in live])
        plan = StepPlan(budget=self.budget)
        for _, st in live:                                # first forward: what the draft has not seen
            plan.compute(st, len(st.tokens) - st.num_computed_tokens)
        for _ in range(k if live else 0):
            plan.is_prefill = any(n > 1 for n in plan.num_new_tokens)
            logits, plan = self.runner.run(plan), StepPlan(budget=self.budget)   # (B, vocab): each one's next token
            drawn = self._agree(live, [self._draw(seq, row, greedy) for (seq, _), row, greedy
                                       in zip(live, logits, logits.argmax(-1).tolist())])
            for (seq, st), (token, q) in zip(live, drawn):
                drafts[seq.seq_id][0].append(token)
                drafts[seq.seq_id][1].append(q)
                st.tokens.append(token)
                plan.compute(st, 1)
        for seq, st in live:                              # forget the drafts' own K/V
            del st.tokens[len(seq.prompt_ids) + len(seq.output_ids):]
            st.num_computed_tokens = len(st.tokens)
            self.blocks.truncate(st, len(st.tokens))
        return [Draft(ids, torch.stack(qs) if qs and qs[0] is not None else None)
                for ids, qs in (drafts.get(seq.seq_id, ([], [])) for seq in seqs)]

    def _catch_up(self, states: list[DraftState]) -> None:
        """Forwards of at most `budget` tokens over what the draft has not seen, each state's last
        unseen token excepted, until the rest fits one forward (len(states) <= max_num_seqs <=
        budget, so it always does): their logits are not needed, only their K/V."""
        while sum(len(st.tokens) - st.num_computed_tokens for st in states) > self.budget:
            plan = StepPlan(budget=self.budget)
            for st in states:
                n = min(len(st.tokens) - st.num_computed_tokens - 1, plan.budget_left)
                if n > 0:
                    plan.compute(st, n)
            plan.is_prefill = True
            self.runner.run(plan)

    def _state(self, seq: Sequence, k: int) -> DraftState | None:
        """The sequence's draft state with blocks for its tokens and k - 1 drafts, or None (no
        room in the draft's pool: it drafts nothing this step, and starts over next time)."""
        st = self.states.get(seq.seq_id)
        if st is None:
            st = self.states[seq.seq_id] = DraftState(seq.seq_id)
            self.blocks.allocate(st, 0)
        st.tokens = seq.prompt_ids + seq.output_ids
        if not self.blocks.can_grow(st, len(st.tokens) + k - 1):
            self.release(seq)
            return None
        self.blocks.grow(st, len(st.tokens) + k - 1)
        return st

    def _agree(self, live, drawn: list[tuple[int, torch.Tensor | None]]) -> list[tuple[int, torch.Tensor | None]]:
        """Tensor-parallel: a sampled draft is rank 0's (only rank 0's generators follow the
        verify's draws), sent to the others; greedy drafts agree by themselves (same logits)."""
        if self.tp is None or all(seq.params.greedy for seq, _ in live):
            return drawn
        if self.tp.driver:
            self.tp.send("tokens", [token for token, _ in drawn])
            return drawn
        return [(token, q) for token, (_, q) in zip(self.tp.receive_tokens(), drawn)]

    def _draw(self, seq: Sequence, row: torch.Tensor, greedy: int) -> tuple[int, torch.Tensor | None]:
        if seq.params.greedy:
            return greedy, None
        q = probs(row[None], seq.params)[0]
        return torch.multinomial(q, 1, generator=self.generators[seq.seq_id]).item(), q

    def release(self, seq: Sequence) -> None:
        st = self.states.pop(seq.seq_id, None)
        if st is not None and self.blocks.holds(st):    # (a failure may have come between the two)
            self.blocks.free(st)

    def rebuild(self) -> None:
        self.states.clear()
        self.blocks.rebuild()

    def check(self, live: set[int]) -> None:
        assert set(self.states) <= live, "a draft state outlives its request"
        self.blocks.check(list(self.states.values()))


def draft_depth(target_layers: int, num_layers: int | None) -> int:
    """The self-draft's layers: draft_num_layers, by default half the target's."""
    return num_layers or max(1, target_layers // 2)


def self_draft(target: Model, num_layers: int) -> Model:
    """The target's first num_layers layers, its final norm and head, sharing their weights."""
    if num_layers >= target.cfg.num_layers:
        raise ValueError(f"draft_num_layers ({num_layers}) must be below the target's {target.cfg.num_layers}")
    with torch.device("meta"):                            # a shell: every module is the target's
        draft = Model(dataclasses.replace(target.cfg, num_layers=num_layers))   # (this rank's shapes)
    draft.rotary, draft.embed, draft.norm, draft.lm_head = target.rotary, target.embed, target.norm, target.lm_head
    draft.layers = nn.ModuleList(target.layers[:num_layers])
    return draft
