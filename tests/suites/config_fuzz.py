"""A differential config fuzzer and an interrupt fuzzer, for every engine from preemption (p08) on.

The hand-written suites drive each engine through configurations someone thought of. What they
miss lives in the corners nobody lists: one seat and a budget of one token, blocks of one token,
a pool so small that every other step preempts, a partial-prefill limit above half the budget,
drafts beside prefill chunks, a decode batch one lane past a graph bucket. So a seed draws
  - an engine configuration from the switches the phase's EngineConfig has (its dataclass
    fields decide): seats, token budget, block size, partial prefills, prefix caching, preemption
    by recompute or swap with a pool sized to force it, speculation (n-gram or draft model, k, the
    batch-size switch); from the CUDA-graph phase on, half the time, the CPU stand-in of the
    graph runner (the very padded static-buffer forward a replay runs, eagerly); from the
    tensor-parallel phase on, a quarter of the cases without it, two ranks on gloo; from the MLA
    phase on, the model is tiny-mla and the decode absorbed or naive; from the prefill/decode
    phase on, one case in ten prefills in a second process (gloo) and decodes in the first;
  - a workload: prompts that share one to three blocks and more, repeat exactly, fill the
    context or hold one token; greedy lengths and priorities; run as one generate() call, or
    through the step API with requests arriving while others decode and some aborted.
The oracle is the phase itself, used plainly. Every idea from p08 on reorganizes work (batching,
paging, chunks, cached prefixes, preemption, drafts, graph lanes) and must not change a greedy
float32 token, so every request that finishes must carry the tokens it gets when it runs alone on
an engine of that phase with the default configuration. After every call the block accounting
is whole (llm.check()) and the engine idle, and no forward step, the draft model's included,
computes more tokens than max_num_batched_tokens.

The interrupt fuzzer puts a Ctrl-C at a random line of the engine's code inside generate(): it
can fall between any two statements of the bookkeeping, which is what the engine's recover()
must survive. Half the cases put a second one inside that clean-up. Afterwards the engine, if it
says it recovered, must pass check(); and the next call must give the tokens of each request run
alone and leave the accounting whole.

Every failure names its seed, the configuration it drew and the command that replays it.
`make test` runs a few seeds per phase (two configurations and one interrupted call where the
bookkeeping it fuzzes changed, one of each kind where it is the phase before's), and the seeds that
once caught a bug in that bug's phase and wherever the bug's files change after it; `make test-all`
runs three configurations and two interrupted calls in every phase, and every one of those seeds
from its phase on; the soak (the fuzz_soak marker, which make test and make test-all leave out) runs
FUZZ_CASES configurations and FUZZ_INTERRUPTS interrupted calls per phase (100 each unless set),
from seed FUZZ_SEED on:

    make fuzz FUZZ_CASES=1000 FUZZ_INTERRUPTS=1000                  every phase from p08 on
    make phase-14 fuzz FUZZ_SEED=240 FUZZ_CASES=1 FUZZ_INTERRUPTS=0   one seed of one phase
"""
from __future__ import annotations

import dataclasses
import importlib
import multiprocessing
import os
import random
import runpy
import subprocess
import sys
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import common
from common.sampling import SamplingParams
from tests import selection

MODEL = "tiny-llama"      # the model every case runs on; a phase with latent attention (p17 on) runs
MLA_MODEL = "tiny-mla"    # DeepSeek-V2-style MLA instead (its cache and decode are that phase's idea)
# float32: a reorganized sum must not flip a greedy token; token ids are compared, so no text
BASE = dict(device="cpu", dtype="float32", detokenize=False)
MAX_MODEL_LEN = 64
MAX_NEW_TOKENS = 16
MAX_REQUESTS = 10
ALPHABET = 200            # prompt ids from a small range: n-gram matches and accidental shared blocks
INTERRUPTED_REQUESTS = 5  # at most, in a call the interrupt fuzzer cuts short (it runs on 2 or 3 engines)
FIRST_CASES, FIRST_INTERRUPTS = 3, 2       # make test-all, per phase: seeds 0.. of each kind (the soak: more)
FIRST_RANKED = 3                           # ... and the first seeds of cases on two ranks (p16 on)
SOAK_SEED = 100_000                        # the soak's first seed, past make test's (FUZZ_SEED moves it)

# Seeds that caught a bug stay in make test beside those, from the phase whose bug they caught on:
# an earlier phase lacks the switch the bug needs (graph lanes, drafts, chunks), and there the seed
# draws some other case. A seed stands for its draws: if the generator below changes, these seeds
# draw other cases, so find them again then. In later phases a caught seed is pinned to the case
# it caught: the later phases' own draws (MLA's naive decode, which drops the graph stand-in; two
# ranks; a prefill process; 8-bit Linears) are left out, and their own seeds cover those switches.
CAUGHT_CASES = {19: "p14", 146: "p14", 240: "p14",   # a one-token prompt chunk run as a graph lane (as a decode)
                532: "p14", 551: "p14",              # drafts attached past the step's budget (n-gram, draft model)
                2: "p13",                            # the draft model's first forward over the budget
                100_028: "p19"}                      # fp8: a recomputed prefill's token at a near-tie (NEAR_TIE)
CAUGHT_INTERRUPTS = {149: "p11", 157: "p11", 253: "p11"}  # a clean-up that drops the call's requests but
                                                          # trusts the block accounting a Ctrl-C cut in half
# The files where each caught bug lived (its fix, and the code its case goes through to reach it).
# make test runs a caught seed in its bug's phase and in each later phase whose copy of these files
# differs from the phase before's; make test-all in every phase from its bug's on. A seed not named
# here runs in every phase from its bug's on.
CAUGHT_FILES = {**dict.fromkeys((19, 146, 240), ("cuda_graph.py", "model_runner.py", "scheduler.py")),
                **dict.fromkeys((532, 551), ("speculator.py", "proposers.py", "scheduler.py")),
                2: ("draft_proposer.py", "speculator.py"),
                100_028: ("quant.py", "triton_int8.py"),
                **dict.fromkeys((149, 157, 253), ("engine.py", "block_manager.py"))}   # the clean-up, the accounting

# fp8 (p19 on) keeps 3 mantissa bits: a 1e-7 relative change in one activation (a prefill's sum
# order against a decode's, for a request preempted and recomputed) can carry it across a rounding
# edge, and tiny-mla's logits then move by 0.23 (measured: 1e-7 relative noise on the embeddings,
# 30 draws; float32 and int8 move by 1e-6). So an fp8 request may leave its alone tokens at one
# step only, and only at a near-tie: where the token it took scores within NEAR_TIE of the top of
# the alone run's logits at that step (two such moves apart); its later tokens are not judged.
NEAR_TIE = {"fp8": 0.5}
TIE_TOP_K = 32            # the alone run keeps its top logits per step for that test

# The bookkeeping the fuzzers check (what reorganizes work: batching, paging, chunks, cached
# prefixes, preemption, drafts, graph lanes). Where one of these differs from the phase before's,
# make test runs CHANGED_CASES and CHANGED_INTERRUPTS seeds from 0, fewer than make test-all's
# FIRST_CASES and FIRST_INTERRUPTS (each seed costs a second or more a phase, and the soak draws
# hundreds); where none differs, one of each kind (FIRST_UNCHANGED): the same bookkeeping ran those
# seeds a phase earlier.
FUZZED_FILES = ("engine.py", "scheduler.py", "block_manager.py", "sequence.py", "model_runner.py", "config.py",
                "radix_cache.py", "speculator.py", "proposers.py", "draft_proposer.py", "cuda_graph.py", "sampler.py",
                "kv_cache.py")
CHANGED_CASES, CHANGED_INTERRUPTS = 2, 1
FIRST_UNCHANGED = 1


def previous_phase(phase: "Phase") -> str | None:
    names = selection.phases()
    return names[names.index(phase.name) - 1] if phase.name in names[1:] else None


def changed(files: tuple[str, ...], phase: "Phase") -> bool:
    """Whether the phase's copy of these files differs from the phase before's."""
    return selection.differ(files, phase.name, previous_phase(phase))


def caught(seeds: dict[int, str], phase: "Phase", everywhere: bool = True) -> list[int]:
    """The caught seeds that run in this phase: those caught in it, and those caught in a phase
    before it (everywhere, as make test-all runs them; else where CAUGHT_FILES changed)."""
    return [seed for seed, first in seeds.items() if phase.name[:3] >= first and (
        everywhere or phase.name[:3] == first or seed not in CAUGHT_FILES or changed(CAUGHT_FILES[seed], phase))]


def first_seeds(phase: "Phase", everywhere: bool, count: int, where_changed: int) -> range:
    """Seeds 0.. of one kind: `count` everywhere (make test-all); in make test `where_changed` where
    FUZZED_FILES differ from the phase before's, FIRST_UNCHANGED where they do not."""
    if everywhere:
        return range(count)
    return range(where_changed if changed(FUZZED_FILES, phase) else FIRST_UNCHANGED)


# The forward's arithmetic, whose lines the interrupt fuzzer does not count: an interrupt inside
# a forward reaches the engine at the line that called it, having changed nothing the engine
# keeps books on (K/V half written into blocks of requests the clean-up drops), so counting them
# would only draw interrupts away from the bookkeeping.
FORWARD_FILES = frozenset({"model.py", "layers.py", "attention.py", "attention_backends.py", "kv_cache.py",
                           "triton_decode.py", "rope_store.py", "fused_elementwise.py"})


# --- the phase: which switches it has ------------------------------------------------------------
@dataclass
class Phase:
    """What the fuzzers need to know of a phase: its package, and which switches it has."""
    name: str
    fields: frozenset[str]       # EngineConfig's fields: the switches this engine has

    @property
    def chunks(self) -> bool:
        """Prompts longer than the budget are prefilled in chunks (p11 on). Before that a prompt
        runs whole: a longer one is refused, and a recomputed sequence (prompt and output) may
        pass the budget alone in its step (the scheduler's documented exception)."""
        return "max_num_partial_prefills" in self.fields

    @property
    def graphs(self) -> bool:
        """It has the CUDA-graph runner (p14 on), whose CPU stand-in a case may install."""
        return "cuda_graph" in self.fields

    @property
    def model(self) -> str:
        return MLA_MODEL if "mla_decode" in self.fields else MODEL

    @property
    def tensor_parallel(self) -> bool:
        """Its engine splits over ranks (p16 on): a config case may run on two."""
        return "tensor_parallel_size" in self.fields

    @property
    def disaggregated(self) -> bool:
        """Its engine may prefill in a second process (p18 on): a config case may run so."""
        return "disaggregation" in self.fields

    @property
    def quantized(self) -> bool:
        """Its engine may run 8-bit Linears (p19 on): a config case may quantize."""
        return "quantization" in self.fields

    @property
    def package(self):
        return importlib.import_module(f"phases.{self.name}")

    @property
    def code_roots(self) -> tuple[str, ...]:
        """Where the engine's code lives: the phase's package and common/."""
        return tuple(str(Path(m.__file__).parent) + os.sep for m in (self.package, common))

    def keeps_books(self, filename: str) -> bool:
        """Is this the engine's own code, outside the forward's arithmetic? (What the interrupt
        fuzzer counts: torch's and tqdm's lines are not either.)"""
        return filename.startswith(self.code_roots) and os.path.basename(filename) not in FORWARD_FILES


def load_phase(name: str) -> Phase:
    config = importlib.import_module(f"phases.{name}.config").EngineConfig
    return Phase(name, frozenset(f.name for f in dataclasses.fields(config)))


# --- random configurations ---------------------------------------------------------------------
@dataclass
class Case:
    """Everything one seed decides: engine options, the graph stand-in, pool slack, workloads."""
    seed: int
    options: dict
    graph_batch: int | None = None                  # the stand-in's largest bucket, or no stand-in
    pool_slack: int | None = None                   # blocks above the largest request (None: roomy)
    workloads: list = field(default_factory=list)

    def describe(self) -> str:
        pool = "roomy" if self.pool_slack is None else f"the largest request + {self.pool_slack} blocks"
        graphs = f", graph stand-in up to batch {self.graph_batch}" if self.graph_batch else ""
        return f"seed {self.seed}: {self.options}, pool {pool}{graphs}"


def draw_options(rng: random.Random, phase: Phase) -> dict:
    """Seats, budget, blocks, and each later phase's own switches where its config has them."""
    seats = rng.randint(1, 8)
    budget = rng.choice([seats,                                  # a decode step fills it exactly
                         seats + rng.randint(1, 8),              # room for a short chunk beside
                         rng.choice([16, 32, 64, 256])])         # whole prompts (or still chunks)
    options = dict(max_model_len=MAX_MODEL_LEN, max_num_seqs=seats, max_num_batched_tokens=budget,
                   block_size=rng.choice([1, 2, 4, 8, 16]), preemption=rng.choice(["recompute", "swap"]))
    if phase.chunks:
        options["max_num_partial_prefills"] = rng.randint(1, 4)
    if "enable_prefix_caching" in phase.fields:
        options["enable_prefix_caching"] = rng.random() < 0.7
    if "speculative" in phase.fields:
        options |= draw_speculation(rng, seats)
    return options


def draw_speculation(rng: random.Random, seats: int) -> dict:
    kind = rng.choice([None, "ngram", "draft"])
    if kind is None:
        return {"speculative": None}
    low = rng.randint(1, 3)
    return dict(speculative=kind, num_speculative_tokens=rng.randint(1, 7),
                speculative_disable_by_batch_size=rng.randint(1, seats + 1),
                prompt_lookup_min=low, prompt_lookup_max=rng.randint(low, 5))


def draw_case(seed: int, phase: Phase, num_workloads: int, ranks: bool = True) -> Case:
    """ranks=False: one rank only (the interrupt fuzzer's: a Ctrl-C is held to a step's end on a
    tensor-parallel engine, and tests/pNN_*/test_tensor_parallel.py sends a real one)."""
    rng = random.Random(seed)
    case = Case(seed, draw_options(rng, phase))
    if phase.graphs and rng.random() < 0.5:
        case.graph_batch = rng.randint(1, case.options["max_num_seqs"])
    # Ranks from a stream of their own: the draws above and below are the phases' before it.
    # Not with the graph stand-in, which pads rank 0's forward alone (a GPU captures on every rank).
    # A caught seed keeps the draws of its phase and those before it (see CAUGHT_CASES).
    if "mla_decode" in phase.fields and not pinned(seed, "p17"):   # (a stream of its own too); the naive decode is not
        case.options["mla_decode"] = random.Random(f"{seed}/mla").choice(["absorbed", "naive"])
        if case.options["mla_decode"] == "naive":     # captured on a GPU: no graph stand-in
            case.graph_batch = None
    if ranks and phase.tensor_parallel and not pinned(seed, "p16") and not case.graph_batch \
            and random.Random(f"{seed}/ranks").random() < 0.25:
        case.options["tensor_parallel_size"] = 2
    if ranks and phase.disaggregated and not pinned(seed, "p18") and "tensor_parallel_size" not in case.options \
            and random.Random(f"{seed}/pd").random() < 0.1:   # a prefill process beside (p18 on; its own stream)
        case.options |= {"disaggregation": "pd", "speculative": None}   # PD refuses speculation
    # 8-bit Linears (p19 on; streams of their own). Not on two ranks: each quantizes its own slices,
    # which one rank does not.
    if phase.quantized and not pinned(seed, "p19") and "tensor_parallel_size" not in case.options:
        quant = random.Random(f"{seed}/quant")
        if quant.random() < 0.2:
            case.options["quantization"] = quant.choice(["w8a8", "w8a8-nosmooth", "fp8"])
    return with_workloads(case, rng, phase, num_workloads)


def pinned(seed: int, draws_from: str) -> bool:
    """A caught seed drawn in a phase before the one whose switches a draw adds: that draw is left out."""
    return seed in CAUGHT_CASES and CAUGHT_CASES[seed] < draws_from


def with_workloads(case: Case, rng: random.Random, phase: Phase, num_workloads: int) -> Case:
    """The pool's slack and the workloads, drawn last from the case's main stream."""
    case.pool_slack = rng.choice([None, None, 0, 1, 2, rng.randint(3, 12)])
    longest = MAX_MODEL_LEN if phase.chunks else case.options["max_num_batched_tokens"]
    case.workloads = [draw_workload(rng, longest, case.options["block_size"]) for _ in range(num_workloads)]
    return case


# --- random workloads --------------------------------------------------------------------------
@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    priority: int = 0
    arrival: int = 0                 # the step before which it is added (step API)
    abort_at: int | None = None      # the step before which it is aborted, if still unfinished

    @property
    def params(self) -> SamplingParams:
        return SamplingParams(temperature=0, max_tokens=self.max_tokens, ignore_eos=True)


@dataclass
class Workload:
    requests: list[Request]
    step_api: bool                   # add_request/step/abort_request, or one generate() call


def draw_workload(rng: random.Random, longest_prompt: int, block_size: int) -> Workload:
    """Requests whose prompts relate to each other (prefixes, repeats) as a server's traffic does."""
    requests = []
    for _ in range(rng.randint(1, MAX_REQUESTS)):
        max_tokens = rng.randint(1, MAX_NEW_TOKENS)
        room = min(longest_prompt, MAX_MODEL_LEN - max_tokens)
        prompt = draw_prompt(rng, [r.prompt for r in requests], room, block_size)
        requests.append(Request(prompt, max_tokens, priority=rng.choice([0, 0, 0, 1, 2])))
    step_api = rng.random() < 0.5
    if step_api:
        for r in requests:
            r.arrival = rng.choice([0, 0, rng.randint(1, 24)])
            if rng.random() < 0.15:
                r.abort_at = r.arrival + rng.randint(0, 12)
    return Workload(requests, step_api)


def draw_prompt(rng: random.Random, earlier: list[list[int]], room: int, block_size: int) -> list[int]:
    """One token, near the context's end, a repeat, a shared prefix, a periodic one, or random."""
    kind = rng.choice(["one", "long", "repeat", "shared", "shared", "periodic", "random", "random"])
    if kind in ("repeat", "shared") and not earlier:
        kind = "random"
    if kind == "one":
        return fresh(rng, 1)
    if kind == "long":
        return fresh(rng, max(1, room - rng.randint(0, 2)))
    if kind == "repeat":
        return list(rng.choice(earlier))[:room]
    if kind == "shared":           # 1-3 blocks of an earlier prompt, sometimes a few tokens more
        cut = rng.randint(1, 3) * block_size + rng.choice([0, 0, rng.randint(1, block_size)])
        head = rng.choice(earlier)[:min(cut, room)]
        return head + fresh(rng, rng.randint(0, room - len(head)))
    if kind == "periodic":         # what prompt lookup finds drafts in
        period = fresh(rng, rng.randint(1, 4))
        return (period * room)[:rng.randint(1, room)]
    return fresh(rng, rng.randint(1, room))


def fresh(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(1, ALPHABET) for _ in range(n)]


# --- the oracle: each request run alone --------------------------------------------------------
class Alone:
    """Greedy tokens of each prompt run alone on a default engine of the phase. One run per prompt,
    as far as its requests have asked: a greedy run of m tokens is the first m of a longer run (the
    same steps, one request, one token each), so a request asking for more runs the prompt again,
    further (a forward per token: most requests ask for far fewer than fit). A quantized case (p19
    on) is held to a default engine quantized the same way: its arithmetic is another on purpose."""

    def __init__(self, phase: Phase):
        self.phase = phase
        self.llm = phase.package.LLM(phase.model, max_model_len=MAX_MODEL_LEN, **BASE)
        self.quantized: dict[str, object] = {}     # quantization -> its default engine, built on first use
        self.answers: dict[tuple, list[int]] = {}
        self.top: dict[tuple, list[tuple[torch.Tensor, torch.Tensor]]] = {}   # NEAR_TIE's: per step, top logits, ids

    def engine(self, quantization: str | None):
        if quantization is None:
            return self.llm
        if quantization not in self.quantized:
            self.quantized[quantization] = self.phase.package.LLM(self.phase.model, max_model_len=MAX_MODEL_LEN,
                                                                  quantization=quantization, **BASE)
        return self.quantized[quantization]

    def tokens(self, prompt: list[int], max_tokens: int, quantization: str | None = None) -> list[int]:
        key = (quantization, *prompt)
        if len(self.answers.get(key, ())) < max_tokens:
            self.answers[key], self.top[key] = self.run(prompt, max_tokens, quantization)
        return self.answers[key][:max_tokens]

    def run(self, prompt: list[int], max_tokens: int, quantization: str | None):
        """The prompt alone: its greedy tokens, and (NEAR_TIE's modes) each step's top logits."""
        llm = self.engine(quantization)
        if hasattr(llm, "reset_prefix_cache"):            # alone: nothing cached from the last one
            llm.reset_prefix_cache()
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        with self.top_logits(quantization in NEAR_TIE) as steps:
            return llm.generate([prompt], params)[0].token_ids, steps

    @contextmanager
    def top_logits(self, wanted: bool):
        """The engine's sampler wrapped for one call: each step's top TIE_TOP_K logits and ids."""
        steps, engine = [], importlib.import_module(f"phases.{self.phase.name}.engine")
        sample_batch = engine.sample_batch

        def recording(logits, *args, **kwargs):
            steps.append(logits[0].float().topk(TIE_TOP_K))
            return sample_batch(logits, *args, **kwargs)
        engine.sample_batch = recording if wanted else sample_batch
        try:
            yield steps
        finally:
            engine.sample_batch = sample_batch

    def near_tie(self, prompt: list[int], got: list[int], quantization: str | None) -> bool:
        """Whether `got` leaves the alone tokens at a step where the alone run's logits rank the
        token it took within NEAR_TIE of their top (see NEAR_TIE)."""
        key, tie = (quantization, *prompt), NEAR_TIE.get(quantization)
        expected = self.answers[key]
        step = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
        if tie is None or step is None or step >= len(self.top[key]):
            return False
        values, ids = self.top[key][step]
        hit = (ids == got[step]).nonzero()
        return len(hit) > 0 and float(values[0] - values[hit[0, 0]]) <= tie


# --- building the engine, watching its steps ----------------------------------------------------
class Stuck(Exception):
    """The engine took far more steps than its workload can need."""


class StepWatch:
    """Wraps the engine's forward runners (the target's and a draft model's) and its step():
    records each forward's new tokens over the budget, and stops a call that goes nowhere."""

    def __init__(self, llm, phase: Phase, budget: int):
        self.phase, self.budget, self.over, self.steps, self.max_steps = phase, budget, [], 0, 0
        for who, runner in runners(llm):
            runner.run = self._counted(who, runner.run)
        real_step = llm.step

        def step():
            self.steps += 1
            if self.steps > self.max_steps:
                raise Stuck(f"{self.steps} steps, more than {self.max_steps}")
            return real_step()
        llm.step = step

    def allow(self, workload: Workload) -> None:
        """A call's step limit: generous, far above any honest schedule of these requests."""
        self.steps = 0
        self.max_steps = 200 + 20 * sum(len(r.prompt) + r.max_tokens for r in workload.requests)

    def _counted(self, who: str, run):
        def counted(*args, **kwargs):
            tokens, seqs = step_size(*args)
            if tokens > self.budget and not (seqs == 1 and not self.phase.chunks):
                self.over.append(f"{who} forward of {tokens} tokens over {seqs} sequences")
            return run(*args, **kwargs)
        return counted


def runners(llm) -> list[tuple[str, object]]:
    found = [("target", llm.runner)]
    proposer = getattr(getattr(llm, "speculator", None), "proposer", None)
    if getattr(proposer, "runner", None) is not None:
        found.append(("draft model", proposer.runner))
    return found


def step_size(plan, is_prefill=None, *_):
    """(new tokens, sequences) of one forward: a plan's (p10 on), or (seqs, is_prefill) before:
    a prefill computes each sequence's prefill_ids, a decode one token each."""
    if hasattr(plan, "num_new_tokens"):
        return sum(plan.num_new_tokens), len(plan.seqs)
    return (sum(len(s.prefill_ids) for s in plan) if is_prefill else len(plan)), len(plan)


def build(phase: Phase, case: Case, token_bytes: int):
    """The case's engine: its options, a pool sized from its workloads, the graph stand-in."""
    llm = sized_engine(phase, case, token_bytes)
    if case.graph_batch:
        install_graph_stand_in(phase, llm, case.graph_batch)
    return llm, StepWatch(llm, phase, case.options["max_num_batched_tokens"])


def sized_engine(phase: Phase, case: Case, token_bytes: int):
    """An engine whose pool holds the largest request plus pool_slack blocks: every request must
    fit the whole pool (or it is refused), and with little slack running ones preempt each other.
    A phase may share kv_cache_bytes out among pools (p13 on: a self-draft keeps its own, the
    bytes split by layers, the target's share above half); where the target's share cannot hold
    the largest request, the engine is built again with twice the bytes."""
    def engine(pool_bytes: int | None):
        pool = {} if pool_bytes is None else {"kv_cache_bytes": pool_bytes}
        return phase.package.LLM(phase.model, **BASE, **case.options, **pool)
    if case.pool_slack is None:
        return engine(None)
    need = max(-(-(len(r.prompt) + r.max_tokens) // case.options["block_size"])
               for w in case.workloads for r in w.requests)
    pool_bytes = (need + case.pool_slack) * case.options["block_size"] * token_bytes
    try:
        llm = engine(pool_bytes)
        if llm.scheduler.block_manager.num_blocks >= need:
            return llm
        shut_down(llm)
    except ValueError:                 # its share held no block at all
        pass
    return engine(2 * pool_bytes)


def install_graph_stand_in(phase: Phase, llm, max_batch: int) -> None:
    """What the engine captures on a GPU, run eagerly: buckets, padded lanes, static buffers."""
    graphs = importlib.import_module(f"phases.{phase.name}.cuda_graph")
    llm.runner.graphs = graphs.GraphRunner(llm.model, llm.cache, llm.runner.backend, graphs.buckets_up_to(max_batch),
                                           width=-(-llm.max_model_len // llm.cache.block_size),
                                           scratch_block=llm.cache.scratch_block, capture=False)


# --- running a workload, judging it -------------------------------------------------------------
def run_workload(llm, watch: StepWatch, workload: Workload) -> dict[int, list[int] | None]:
    """Request index -> tokens of every request that finished, None for one aborted unfinished."""
    watch.allow(workload)
    if workload.step_api:
        return run_steps(llm, workload)
    return token_ids(generate_call(llm, workload)())


def generate_call(llm, workload: Workload):
    """llm.generate() of the workload's requests, as a call; its arguments are built now (under a
    tracer, building them would count lines of common/ that run before generate() does)."""
    reqs = workload.requests
    prompts, params, priorities = [r.prompt for r in reqs], [r.params for r in reqs], [r.priority for r in reqs]
    return lambda: llm.generate(prompts, params, priorities=priorities)


def token_ids(outputs) -> dict[int, list[int]]:
    return {i: o.token_ids for i, o in enumerate(outputs)}


def run_steps(llm, workload: Workload) -> dict[int, list[int] | None]:
    """Arrivals between steps, aborts of unfinished requests (from p09, which has abort_request)."""
    reqs, ids, done, step = workload.requests, {}, {}, 0          # ids: request id -> index
    while len(ids) < len(reqs) or llm.has_unfinished():
        for i, r in enumerate(reqs):
            if r.arrival == step:
                ids[llm.add_request(r.prompt, r.params, priority=r.priority)] = i
            if r.abort_at == step and i not in done and hasattr(llm, "abort_request"):
                llm.abort_request(next(k for k, v in ids.items() if v == i))
                done[i] = None
        for request_id, out in llm.step():
            assert ids[request_id] not in done, f"request {ids[request_id]} finished twice, or after its abort"
            done[ids[request_id]] = out.token_ids
        step += 1
    return done


def judge(llm, watch: StepWatch, workload: Workload, got: dict[int, list[int] | None], alone: Alone) -> list[str]:
    """What went wrong in a finished call: tokens unlike the request's alone, a request lost, a
    forward over the budget, accounting not whole, an engine not idle."""
    problems = [f"budget {watch.budget}: {o}" for o in watch.over[:3]]
    watch.over.clear()
    for i, r in enumerate(workload.requests):
        if i not in got:
            problems.append(f"request {i} never finished")
            continue
        if got[i] is None:                    # aborted: whatever it had is gone
            continue
        expected = alone.tokens(r.prompt, r.max_tokens, getattr(llm.config, "quantization", None))
        if got[i] != expected and not alone.near_tie(r.prompt, got[i], getattr(llm.config, "quantization", None)):
            problems.append(f"request {i} (prompt of {len(r.prompt)}: {short(r.prompt)}, max_tokens {r.max_tokens}, "
                            f"priority {r.priority}): {got[i]} != alone {expected}")
    return problems[:4] + whole(llm)


def whole(llm) -> list[str]:
    """llm.check() and idleness, as problems rather than an exception."""
    problems = [] if not llm.has_unfinished() else ["the engine is not idle after the call"]
    try:
        llm.check()
    except AssertionError as e:
        problems.append(f"check() failed: {e}")
    return problems


def short(ids: list[int]) -> str:
    return str(ids) if len(ids) <= 12 else f"[{', '.join(map(str, ids[:10]))}, ... {ids[-1]}]"


# --- one config case ----------------------------------------------------------------------------
def config_case(phase: Phase, seed: int, alone: Alone, token_bytes: int) -> list[str]:
    """Two or three calls on one engine of a random configuration (the later ones meet what the
    earlier left in the prefix cache); the problems found, each naming the call."""
    case = draw_case(seed, phase, num_workloads=random.Random(f"{seed}/calls").randint(2, 3))
    with forked_processes(phase):
        llm, watch = build(phase, case, token_bytes)
        try:
            for n, workload in enumerate(case.workloads):
                problems = judge(llm, watch, workload, run_workload(llm, watch, workload), alone)
                if problems:
                    return [f"call {n} ({mode(workload)}): {p}" for p in problems]
            return []
        finally:
            shut_down(llm)


def shut_down(llm) -> None:
    """A tensor-parallel engine's other ranks stop now (one process group at a time per process)."""
    if hasattr(llm, "shutdown"):
        llm.shutdown()


def mode(workload: Workload) -> str:
    return "step API" if workload.step_api else "generate()"


# --- a case's second process: forked from a server, not started afresh ----------------------------
# A case on two ranks (p16 on) or on a prefill/decode pair (p18 on) starts a second process:
# spawn_rank's `python -m phases.<phase>.rank SPEC`, whose interpreter spends ~5 s of CPU importing
# torch and transformers before it builds a tiny engine (several times what the case then runs),
# and a second or two more to exit. So the fuzzer hands that command line to a forkserver that
# imported the phase once (one thread, safe to fork: the engine's own workers start so): the process
# forks from it and runs the module as __main__ under spawn_rank's environment and preexec_fn. The
# engine's code runs unchanged; a fresh interpreter per rank, the one thing left out, is
# tests/pNN_*/test_tensor_parallel.py's (ranks started, killed and dying with rank 0; torchrun).
FORKS = multiprocessing.get_context("forkserver")


class ForkedProcess:
    """subprocess.Popen([python, "-m", module, *args], env=..., preexec_fn=...), as spawn_rank calls it,
    forked from FORKS: what the engine asks of its process (poll(), wait(), kill(), returncode)."""

    def __init__(self, argv: list[str], env: dict[str, str], preexec_fn=None):
        assert argv[1] == "-m", f"not a module run: {argv}"
        self.args = argv
        self.process = FORKS.Process(target=run_as_main, args=(argv[2], argv[3:], env, preexec_fn),
                                     daemon=True)        # one left running ends with the test process
        self.process.start()

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.process.exitcode

    def kill(self) -> None:
        self.process.kill()


def run_as_main(module: str, args: list[str], env: dict[str, str], preexec_fn) -> None:
    """In the forked process: what `python -m module *args` runs, under env."""
    os.environ.clear()
    os.environ.update(env)
    if preexec_fn is not None:
        preexec_fn()
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


@contextmanager
def forked_processes(phase: Phase):
    """While the block runs, the phase's spawn_rank starts its process from FORKS (p16 on; before,
    an engine starts none). parallel_state's `subprocess` is swapped, so spawn_rank's own code runs."""
    if not phase.tensor_parallel:
        yield
        return
    state = importlib.import_module(f"phases.{phase.name}.parallel_state")
    FORKS.set_forkserver_preload([phase.package.__name__, __name__])   # no effect once the server runs
    forked = SimpleNamespace(Popen=ForkedProcess, TimeoutExpired=subprocess.TimeoutExpired)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(state, "subprocess", forked)
        yield


# --- interrupts ---------------------------------------------------------------------------------
class LineTracer:
    """A sys.settrace hook over the engine's bookkeeping (Phase.keeps_books): counts the lines it
    executes and raises KeyboardInterrupt as line `stop` is about to run (None: count only).
    Lines inside torch, tqdm or the forward's arithmetic are not counted: an interrupt there
    reaches the engine at the line that called them. Python unsets a tracer that raises, so each
    one fires once."""

    def __init__(self, phase: Phase, stop: int | None = None):
        self.phase, self.stop, self.lines, self.where = phase, stop, 0, None
        self.files: dict[str, bool] = {}        # file name -> counted (asked once per file)

    def __call__(self, frame, event, arg):
        name = frame.f_code.co_filename
        if name not in self.files:
            self.files[name] = self.phase.keeps_books(name)
        return self.local if self.files[name] else None

    def local(self, frame, event, arg):
        if event == "line":
            self.lines += 1
            if self.lines == self.stop:
                self.where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} in {frame.f_code.co_name}"
                raise KeyboardInterrupt(self.where)
        return self.local


def traced(tracer: LineTracer, call):
    """call() under the tracer; the tracer is gone afterwards, however call() ended."""
    sys.settrace(tracer)
    try:
        return call()
    finally:
        sys.settrace(None)


def trace_recover(llm, tracer: LineTracer) -> None:
    """Run the engine's recover() under its own tracer (the first one is gone once it fired):
    counts the clean-up's lines, or interrupts it at line tracer.stop. Undone by untrace_recover."""
    real = llm.recover
    llm.recover = lambda: traced(tracer, real)


def untrace_recover(llm) -> None:
    llm.__dict__.pop("recover", None)


def interrupted_call(llm, watch: StepWatch, workload: Workload, first: LineTracer, second: LineTracer) -> str | None:
    """generate() interrupted at first.stop (and its clean-up at second.stop). A problem, or None."""
    call = generate_call(llm, workload)
    watch.allow(workload)
    trace_recover(llm, second)
    try:
        traced(first, call)
    except KeyboardInterrupt:
        if first.where is None:          # not ours: a Ctrl-C at the keyboard stops the run
            raise
        return None
    finally:
        untrace_recover(llm)
    return f"generate() returned although interrupted at {first.where}" if first.where else None


def interrupt_case(phase: Phase, seed: int, alone: Alone, token_bytes: int) -> list[str]:
    """A clean call A on engine 1 counts the lines generate() executes (L). Engine 2, of the same
    configuration and history, runs A interrupted at line N, uniform in 1..L (the same path up to
    there: the engines are deterministic), and counts the lines of the clean-up (R); then the
    engine must be whole if it says it recovered, and call B right. In half the cases engine 3
    repeats that with a second interrupt at line M of the clean-up, uniform in 1..R; then only
    call B is judged (the next call finishes a clean-up cut short)."""
    rng = random.Random(f"{seed}/interrupts")
    case = draw_case(seed, phase, num_workloads=3, ranks=False)   # a warm-up call, call A, call B
    warm, call_a, call_b = case.workloads
    warm.requests = warm.requests[:rng.choice([0, 3])]    # a cold engine, or a few prefixes cached
    for call in (call_a, call_b):                         # (each call runs on two or three engines)
        call.requests, call.step_api = call.requests[:INTERRUPTED_REQUESTS], False

    def engine():
        return warmed_up(phase, case, token_bytes)

    lines, problems = clean_line_count(phase, engine(), call_a, alone)
    if problems:
        return problems
    n, twice = rng.randint(1, lines), rng.random() < 0.5
    first, cleanup = LineTracer(phase, n), LineTracer(phase)
    what = f"interrupted at line {n} of {lines}"
    problems = interrupted(engine(), call_a, call_b, first, cleanup, alone, what)
    if twice and cleanup.lines and not problems:
        m = rng.randint(1, cleanup.lines)
        problems = interrupted(engine(), call_a, call_b, LineTracer(phase, n), LineTracer(phase, m), alone,
                               f"{what}, then at line {m} of {cleanup.lines} of the clean-up")
    return problems


def warmed_up(phase: Phase, case: Case, token_bytes: int):
    """A new engine of the case, after its warm-up call (if it has one): what the prefix cache
    holds, and the ids the engine hands out, are the same for every engine of the case."""
    llm, watch = build(phase, case, token_bytes)
    warm = case.workloads[0]
    if warm.requests:
        run_workload(llm, watch, warm)
    return llm, watch


def clean_line_count(phase: Phase, built, call: Workload, alone: Alone) -> tuple[int, list[str]]:
    """The engine lines a clean run of the call executes, and what went wrong in it."""
    llm, watch = built
    counter, generate = LineTracer(phase), generate_call(llm, call)
    watch.allow(call)
    got = token_ids(traced(counter, generate))
    return counter.lines, [f"clean call A: {p}" for p in judge(llm, watch, call, got, alone)]


def interrupted(built, call_a: Workload, call_b: Workload, first: LineTracer, second: LineTracer,
                alone: Alone, what: str) -> list[str]:
    """Call A interrupted as the tracers say, then call B: the problems, each saying where A was cut."""
    llm, watch = built
    problem = interrupted_call(llm, watch, call_a, first, second)
    where = f"{what} ({first.where}{'; ' + second.where if second.where else ''})"
    if problem:
        return [f"{where}: {problem}"]
    if not second.where and not llm._failed:       # it says it recovered: it must be whole now
        problems = whole(llm)
        if problems:
            return [f"{where}, recover() finished: {p}" for p in problems]
    got = run_workload(llm, watch, call_b)
    return [f"{where}, then call B: {p}" for p in judge(llm, watch, call_b, got, alone)]


# --- the tests ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fuzz_phase(phase) -> Phase:
    return load_phase(phase)


@pytest.fixture(scope="module")
def alone(fuzz_phase) -> Alone:
    return Alone(fuzz_phase)


@pytest.fixture(scope="module")
def token_bytes(alone) -> int:
    """Bytes of one token's K/V in the pool (K and V, every layer): kv_cache_bytes per token."""
    return alone.llm.model_config.kv_bytes_per_token(torch.float32)


def run_seeds(run_case, phase: Phase, seeds, alone: Alone, token_bytes: int) -> None:
    """Every seed, all failures collected (a soak reports each seed that fails, not the first)."""
    failures = []
    for seed in seeds:
        try:
            problems = run_case(phase, seed, alone, token_bytes)
        except Exception as e:     # the engine raised (Stuck included): a failure of this seed
            problems = [f"raised {type(e).__name__}: {e}\n{''.join(traceback.format_exc(limit=-4))}"]
        if problems:
            failures.append(f"{describe(phase, seed, run_case)}\n    " + "\n    ".join(problems))
    if failures:
        pytest.fail(f"{len(failures)} of {len(seeds)} seeds failed:\n" + "\n".join(failures), pytrace=False)


def describe(phase: Phase, seed: int, run_case) -> str:
    """The phase, the seed, its configuration, and the command that runs that seed alone."""
    case = draw_case(seed, phase, num_workloads=1, ranks=run_case is config_case)
    cases, interrupts = ("1", "0") if run_case is config_case else ("0", "1")
    return (f"{phase.name} {case.describe()}\n    replay: make phase-{phase.name[1:3]} fuzz FUZZ_SEED={seed} "
            f"FUZZ_CASES={cases} FUZZ_INTERRUPTS={interrupts}")


def soak_seeds(variable: str) -> range:
    """FUZZ_CASES or FUZZ_INTERRUPTS seeds (default 100) from FUZZ_SEED on."""
    first = int(os.environ.get("FUZZ_SEED") or SOAK_SEED)
    return range(first, first + int(os.environ.get(variable) or 100))


def test_random_configs_give_each_request_its_tokens_alone(fuzz_phase, alone, token_bytes, pytestconfig):
    """Random configurations and workloads: each request's tokens alone, the budget, the accounting."""
    everywhere = selection.run_all(pytestconfig)
    seeds = sorted({*first_seeds(fuzz_phase, everywhere, FIRST_CASES, CHANGED_CASES), *caught(CAUGHT_CASES, fuzz_phase, everywhere),
                    *ranked_seeds(fuzz_phase),
                    *pd_seeds(fuzz_phase), *quant_seeds(fuzz_phase)})
    run_seeds(config_case, fuzz_phase, seeds, alone, token_bytes)


RANK_FILES = ("parallel_state.py", "parallel_layers.py")   # the ranks' own code (p16 on)


def ranked_seeds(phase: Phase) -> list[int]:
    """The first seeds whose case runs on two ranks (tensor-parallel phases; none before):
    FIRST_RANKED where the ranks' code differs from the phase before's, one elsewhere (the ranks
    still run that phase's engine; each such case starts processes: seconds a case)."""
    if not phase.tensor_parallel:
        return []
    count = FIRST_RANKED if changed(RANK_FILES, phase) else 1
    seeds = (s for s in range(10_000) if draw_case(s, phase, 1).options.get("tensor_parallel_size", 1) > 1)
    return [next(seeds) for _ in range(count)]


PD_FILES = ("disaggregated.py", "kv_connector.py")   # the prefill/decode pair's own code (p18 on)


def pd_seeds(phase: Phase) -> list[int]:
    """The first seeds whose case runs a prefill/decode pair (none before p18): two where the
    pair's code differs from the phase before's, one elsewhere (each starts a process)."""
    if not phase.disaggregated:
        return []
    count = 2 if changed(PD_FILES, phase) else 1
    seeds = (s for s in range(10_000) if draw_case(s, phase, 1).options.get("disaggregation"))
    return [next(seeds) for _ in range(count)]


QUANT_FILES = ("quant.py", "smoothing.py", "triton_int8.py")   # the 8-bit Linears' own code (p19 on)


def quant_seeds(phase: Phase) -> list[int]:
    """The first seeds whose case quantizes (none before p19): one int8 and one fp8 where that code
    differs from the phase before's, one int8 elsewhere (each builds a quantized engine alone too)."""
    if not phase.quantized:
        return []
    modes = ["w8a8", "fp8"] if changed(QUANT_FILES, phase) else ["w8a8"]
    drawn = ((s, draw_case(s, phase, 1).options.get("quantization")) for s in range(10_000))
    found: dict[str, int] = {}
    for seed, mode in drawn:
        if mode in modes and mode not in found:
            found[mode] = seed
            if len(found) == len(modes):
                break
    return sorted(found.values())


def test_an_interrupted_call_leaves_the_engine_whole(fuzz_phase, alone, token_bytes, pytestconfig):
    """Ctrl-C at a random line of generate() (and of its clean-up): whole, then the next call right."""
    everywhere = selection.run_all(pytestconfig)
    seeds = sorted({*first_seeds(fuzz_phase, everywhere, FIRST_INTERRUPTS, CHANGED_INTERRUPTS),
                    *caught(CAUGHT_INTERRUPTS, fuzz_phase, everywhere)})
    run_seeds(interrupt_case, fuzz_phase, seeds, alone, token_bytes)


@pytest.mark.fuzz_soak
@pytest.mark.timeout(0)
def test_soak_random_configs(fuzz_phase, alone, token_bytes):
    run_seeds(config_case, fuzz_phase, soak_seeds("FUZZ_CASES"), alone, token_bytes)


@pytest.mark.fuzz_soak
@pytest.mark.timeout(0)
def test_soak_interrupted_calls(fuzz_phase, alone, token_bytes):
    run_seeds(interrupt_case, fuzz_phase, soak_seeds("FUZZ_INTERRUPTS"), alone, token_bytes)
