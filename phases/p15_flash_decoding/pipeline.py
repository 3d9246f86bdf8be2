"""Pipeline parallelism: the decoder's layers split over 2 stages, one process (and device) each.

Stage 0 (the head) owns the embedding, the first half of the layers and the scheduler: it is an
LLM whose model stops half way. Stage 1 (the tail) owns the other half, the final norm and the
LM head. Per step the head sends the tail a description of the batch (ints) and the hidden states
(T, hidden); the tail rebuilds the same StepContext from the description with its own
ModelRunner and sends the logits (B, vocab) back; the head samples. Each stage keeps K/V for its
own layers only, in blocks addressed by the one block table the head's scheduler decides.

Two micro-batches: requests are split into two groups, each with its own scheduler over the one
block manager (vLLM's "virtual engines"), so the head computes one group's step while the tail
computes the other's. Every step of a group still waits for its previous step to come back.
"""
from __future__ import annotations

import dataclasses
from collections import deque

import torch
import torch.distributed as dist
from torch import nn

from common.model_config import ModelConfig
from common.weights import skip_init

from .engine import LLM
from .kv_cache import KVCache, memory_budget, num_blocks_for
from .layers import RMSNorm, RotaryEmbedding
from .model import DecoderLayer, Model
from .sampler import make_generator
from .scheduler import Scheduler, StepPlan
from .sequence import Sequence

HEAD, TAIL = 0, 1   # the ranks of the two stages


def stage_layers(num_layers: int, rank: int) -> range:
    """The layers of stage `rank`: the first half (rounded up) on the head, the rest on the tail."""
    if num_layers < 2:
        raise ValueError(f"a 2-stage pipeline needs at least 2 layers, the model has {num_layers}")
    half = (num_layers + 1) // 2
    return range(0, half) if rank == HEAD else range(half, num_layers)


class StageModel(nn.Module):
    """Layers [start, stop) of Model; the first stage embeds the tokens, the last ends with the
    norm and the LM head. Its layers are numbered from 0 here: they index this stage's KV pool."""

    def __init__(self, cfg: ModelConfig, layers: range):
        super().__init__()
        self.cfg, self.start = cfg, layers.start
        self.first, self.last = layers.start == 0, layers.stop == cfg.num_layers
        self.rotary = RotaryEmbedding(cfg)
        if self.first:
            self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(len(layers)))
        if self.last:
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor, step) -> torch.Tensor:
        """x: (T,) token ids on the first stage, else (T, hidden) from the stage before.
        Returns (T, hidden) for the next stage, or fp32 logits (B, vocab) on the last."""
        x, residual = (self.embed(x) if self.first else x), None
        for layer in self.layers:
            x, residual = layer(x, residual, step)
        if self.last:
            return self.lm_head(self.norm(x, residual)[0][step.last_rows]).float()
        return x + residual                                   # the hidden state the next stage starts from

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        for name, param in self.state_dict().items():
            with torch.no_grad():
                param.copy_(Model._checkpoint_tensor(self._checkpoint_name(name), weights))

    def _checkpoint_name(self, name: str) -> str:
        """Our layer i is the model's layer start + i; a tied LM head is the embedding."""
        if name == "lm_head.weight" and self.cfg.tie_word_embeddings:
            return "embed.weight"
        if name.startswith("layers."):
            i, rest = name.removeprefix("layers.").split(".", 1)
            return f"layers.{self.start + int(i)}.{rest}"
        return name


@dataclasses.dataclass
class SeqView:
    """What ModelRunner.prepare reads of a Sequence, as the tail gets it."""
    new_ids: list[int]          # the tokens the step computes: positions [context - len(new_ids), context)
    num_computed_tokens: int    # context: K/V length once the step is written
    block_table: list[int]

    def token_ids_from(self, start: int) -> list[int]:
        return self.new_ids[start - (self.num_computed_tokens - len(self.new_ids)):]


def describe(plan: StepPlan) -> list[int]:
    """A step as ints: [is_prefill, B], then per sequence [q, its q new ids, context, m, m blocks]."""
    out = [int(plan.is_prefill), len(plan.seqs)]
    for seq, q in zip(plan.seqs, plan.num_new_tokens):
        new = seq.token_ids_from(seq.num_computed_tokens - q)[:q]
        out += [q, *new, seq.num_computed_tokens, len(seq.block_table), *seq.block_table]
    return out


def read_description(ints: list[int]) -> StepPlan:
    """The inverse of describe(): the same plan, over SeqViews (the head kept it to the budget)."""
    plan, i = StepPlan(budget=0, is_prefill=bool(ints[0])), 2
    for _ in range(ints[1]):
        q = ints[i]
        new, context, m = ints[i + 1:i + 1 + q], ints[i + 1 + q], ints[i + 2 + q]
        plan.add(SeqView(new, context, ints[i + 3 + q:i + 3 + q + m]), q)
        i += 3 + q + m
    return plan


class StageEngine(LLM):
    """An LLM built on one stage's part of the model, with a KV pool for that part's layers."""
    rank: int

    def __init__(self, model: str = "smollm2-135m", **options):
        # One process group per direction. NCCL runs a group's sends and receives in order on one
        # stream: on a single group the head's recv of group 0's logits would queue behind its send
        # of group 1's hidden states, which the tail takes only after sending those logits.
        self.to_tail, self.to_head = dist.new_group([HEAD, TAIL]), dist.new_group([HEAD, TAIL])
        super().__init__(model, **options)

    def _build_model(self) -> StageModel:
        with torch.device(self.device), skip_init():     # load_weights() fills every parameter
            model = StageModel(self.model_config, stage_layers(self.model_config.num_layers, self.rank))
        model = model.to(self.dtype)
        model.load_weights(self.source.load_weights(self.device, self.dtype))
        return model.eval()

    def _build_cache(self) -> KVCache:
        """As many blocks as the smaller of the two stages' budgets holds: one block table
        addresses both pools."""
        c, cfg = self.config, self.model_config
        stage_cfg = dataclasses.replace(cfg, num_layers=len(stage_layers(cfg.num_layers, self.rank)))
        budget = c.kv_cache_bytes or memory_budget(self.device, c.gpu_memory_utilization, c.cpu_kv_cache_bytes)
        most = c.max_num_seqs * -(-self.max_model_len // c.block_size)
        mine = num_blocks_for(stage_cfg, self.dtype, c.block_size, budget, most)
        agreed = torch.tensor([mine], device=self.device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        return KVCache(stage_cfg, int(agreed.item()), c.block_size, self.device, self.dtype)

    def _recv(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """Receive from the other stage."""
        other, group = (TAIL, self.to_head) if self.rank == HEAD else (HEAD, self.to_tail)
        t = torch.empty(shape, dtype=dtype, device=self.device)
        dist.recv(t, other, group=group)
        return t


class PipelineHead(StageEngine):
    """Stage 0: schedules two micro-batch groups and keeps one step of each in flight."""
    rank = HEAD

    def __init__(self, model: str = "smollm2-135m", **options):
        super().__init__(model, **options)
        s = self.scheduler
        if s.preemption == "swap":   # the tail holds half of every sequence's K/V and would need its own copies
            raise ValueError("the pipeline preempts by recompute only; use preemption='recompute'")
        self.groups = [s, Scheduler(s.block_manager, s.max_num_seqs, s.max_num_batched_tokens,
                                    max_num_partial_prefills=s.max_num_partial_prefills)]
        self.in_flight: deque = deque()   # (group, seqs, pending sends), oldest first

    def has_unfinished(self) -> bool:
        return any(group.has_unfinished() for group in self.groups)

    def _add(self, seq: Sequence) -> int:
        """A new request joins the group with fewer requests."""
        min(self.groups, key=lambda g: len(g.waiting) + len(g.running) + len(g.swapped)).add(seq)
        self.generators[seq.seq_id] = make_generator(seq.params, self.device)
        self.requests[seq.seq_id] = seq
        return seq.seq_id

    def step(self):
        """One beat: start a step for every group not in flight, then finish the oldest step.
        The head computes the second group while the tail computes the first."""
        busy = [group for group, _, _ in self.in_flight]
        for group in self.groups:
            if all(group is not b for b in busy):
                self._launch(group)
        if not self.in_flight:
            return []
        return self._commit(*self._land())

    def _land(self) -> tuple[Scheduler, list[Sequence], torch.Tensor]:
        """The oldest step in flight: its group, its sequences and their logits (B, vocab)."""
        group, seqs, sends = self.in_flight.popleft()
        logits = self._recv((len(seqs), self.model_config.vocab_size), torch.float32)
        for work in sends:
            work.wait()
        return group, seqs, logits

    def _abort(self, seqs: list[Sequence]) -> None:
        """As LLM._abort, over both groups. The steps in flight land first (their logits are
        dropped): the tail sends them whatever happens, and a later recv must not read them."""
        while self.in_flight:
            self._land()
        for seq in seqs:
            self.groups[1].abort(seq)                 # group 0 is self.scheduler: LLM._abort's
        super()._abort(seqs)

    def _launch(self, group: Scheduler) -> None:
        plan = group.schedule()                 # recompute only: a plan never asks for copies here
        if not plan.seqs:
            return
        hidden = self.runner.run(plan)                             # (T, hidden) after this stage
        ints = describe(plan)
        header = torch.tensor([len(ints), hidden.shape[0]], device=self.device)
        body = torch.tensor(ints, device=self.device)
        sends = [dist.isend(t, TAIL, group=self.to_tail) for t in (header, body, hidden)]
        self.in_flight.append((group, plan.seqs, sends))

    def close(self) -> None:
        """Tell the tail to stop (a header of zeros)."""
        dist.send(torch.zeros(2, dtype=torch.int64, device=self.device), TAIL, group=self.to_tail)


class PipelineTail(StageEngine):
    """Stage 1: runs the second half for every step the head sends, until told to stop."""
    rank = TAIL

    @torch.inference_mode()
    def serve(self) -> None:
        while True:
            num_ints, num_tokens = self._recv((2,), torch.int64).tolist()
            if num_ints == 0:
                return
            plan = read_description(self._recv((num_ints,), torch.int64).tolist())
            hidden = self._recv((num_tokens, self.model_config.hidden_size), self.dtype)
            _, step = self.runner.prepare(plan)
            dist.send(self.model(hidden, step), HEAD, group=self.to_head)   # (B, vocab) fp32 logits


STAGE_ENGINES = {HEAD: PipelineHead, TAIL: PipelineTail}   # rank -> the engine it builds
