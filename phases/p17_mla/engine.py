"""LLM: the engine. Continuous batching over a paged KV cache: every step runs one batch from one
token budget, a decode token for every running request (with drafted tokens to verify, when
speculative decoding is on) and prefill chunks beside them; requests join and leave between steps,
and a new one skips the prefix whose K/V a request before it left in the cache. With
tensor_parallel_size=N, N ranks each run this engine over 1/N of the model (parallel_state.py)."""
from __future__ import annotations

import itertools
import sys
import time
import weakref

import torch
from tqdm import tqdm

from common.loader import resolve
from common.output import Output
from common.requests import prepare_requests
from common.weights import skip_init

from .attention_backends import make_backend
from .block_manager import BlockManager
from .config import EngineConfig
from .cuda_graph import GraphRunner, buckets_up_to
from .draft_proposer import draft_depth
from .kv_cache import KVCache, memory_budget, num_blocks_for
from .model import Model
from .model_runner import ModelRunner
from .parallel_layers import check_shardable
from .parallel_state import Resync, uninterrupted
from . import parallel_state
from .profiler import stage
from .sampler import make_generator, sample_batch
from .scheduler import Scheduler, StepPlan
from .sequence import Sequence
from .speculator import make_speculator


class LLM:
    """LLM(model, **engine_options).generate(prompts, sampling_params) -> list[Output].

    Underneath, the step API: add_request() queues a request, step() runs one forward step and
    returns the requests it finished, has_unfinished() says whether anything is left to do.

    tensor_parallel_size=N: this object is rank 0, which the user talks to; it starts ranks
    1..N-1 (or, under torchrun, joins them), and each of those builds this engine too and calls
    follow(). shutdown() stops them (also at exit and when this object is collected)."""

    def __init__(self, model: str = "smollm2-135m", *, detokenize: bool = True, **options):
        self.config = EngineConfig(model=model, **options)
        self.source = resolve(self.config.model, seed=self.config.seed)
        self.model_config = self.source.config
        self.config.block_size = self.config.resolve_block_size(self.model_config.is_mla)
        if self.model_config.is_mla and self.config.attention_backend == "flash-attn":
            # FlashAttention 4 has no latent-attention kernel: MLA decodes on ours (triton_mla.py)
            print("MLA model: attention_backend flash-attn -> triton (our latent kernel)", file=sys.stderr)
            self.config.attention_backend = "triton"
        self.max_model_len = self.config.resolve_max_model_len(self.model_config.max_position)
        self.detokenize = detokenize
        self.device, self.dtype = self.config.device, self.config.torch_dtype
        self.tp, self._ops = None, []          # ops: what rank 0 sends the other ranks before a step
        if self.config.tensor_parallel_size > 1:   # every check above passed: now start the ranks
            check_shardable(self.model_config, self.config.tensor_parallel_size)
            self.tp = parallel_state.start(self.config.tensor_parallel_size, self.device,
                                           self.config.distributed_timeout_s, model, options, detokenize)
            self._stop_ranks = weakref.finalize(self, self.tp.close)
            self.device = self.tp.device
        self.model = self._build_model()
        self.cache = self._build_cache()       # after the weights: the pool takes what memory is left
        blocks = BlockManager(self.cache.num_blocks, self.cache.block_size, self.config.enable_prefix_caching)
        self.scheduler = Scheduler(blocks, self.config.max_num_seqs, self.config.max_num_batched_tokens,
                                   self.config.preemption, self.config.max_num_partial_prefills)
        self.swapped_kv: dict[int, torch.Tensor] = {}   # seq_id -> its K/V in host memory (swap)
        self.runner = ModelRunner(self.model, self.cache, self.device, make_backend(self.config.attention_backend))
        if self.config.graphs_apply:      # last: the graphs' memory comes after the pool's
            self.runner.graphs = self._capture_graphs()
        self.generators: dict[int, torch.Generator | None] = {}   # seq_id -> its private RNG
        self.speculator = make_speculator(self)   # drafts for the decodes, their verify and rollback
        self.requests: dict[int, Sequence] = {}   # seq_id -> every unfinished request (a server streams
                                                  # their output_ids as they grow)
        self._seq_ids = itertools.count()
        self._last_call: list[Sequence] = []     # generate()'s requests, kept until its next call
        self._failed = False                     # a call failed and recover() has not finished
        torch.manual_seed(self.config.seed)

    def _build_model(self) -> Model:
        with torch.device(self.device), skip_init():     # load_weights() fills every parameter
            model = Model(self.model_config, self.tp).to(self.dtype)
        model.load_weights(self.source.checkpoint())       # this rank's slices only
        model.use_fused_kernels(self.config.fused_kernels)
        model.use_absorbed_decode(self.config.mla_decode == "absorbed")
        return model.eval()

    def _build_cache(self) -> KVCache:
        c = self.config
        budget = c.kv_cache_bytes or memory_budget(self.device, c.gpu_memory_utilization, c.cpu_kv_cache_bytes)
        if c.speculative == "draft":    # a self-draft keeps a pool of as many blocks, of its own layers:
            layers = self.model_config.num_layers           # the two share the budget by layers
            budget = budget * layers // (layers + draft_depth(layers, c.draft_num_layers))
        most = c.max_num_seqs * -(-self.max_model_len // c.block_size)   # more could never be filled
        num_blocks = num_blocks_for(self.model.cfg, self.dtype, c.block_size, budget, most)   # this rank's KV heads
        if self.tp is not None:          # every rank's block manager must see as many blocks
            num_blocks = self.tp.agree_min(num_blocks)
        return KVCache(self.model.cfg, num_blocks, c.block_size, self.device, self.dtype)

    def _capture_graphs(self) -> GraphRunner:
        """One graph per decode bucket up to cuda_graph_max_batch (at most max_num_seqs), block
        tables as wide as max_model_len needs. Reports what capture cost on stderr."""
        c = self.config
        graphs = GraphRunner(self.model, self.cache, self.runner.backend,
                             buckets_up_to(min(c.cuda_graph_max_batch, c.max_num_seqs)),
                             width=-(-self.max_model_len // c.block_size), scratch_block=self.cache.scratch_block)
        print(f"captured {len(graphs.graphs)} decode graphs (batch 1..{graphs.buckets[-1]}) in "
              f"{graphs.capture_seconds:.1f} s, {graphs.graph_bytes / 2**20:.0f} MiB", file=sys.stderr)
        return graphs

    @property
    def graph_stats(self) -> dict:
        """What capturing cost (the bench record carries it): none when this engine runs eagerly."""
        g = self.runner.graphs
        return {} if g is None else {"graph_buckets": g.buckets, "capture_seconds": g.capture_seconds,
                                     "graph_memory_bytes": g.graph_bytes}

    @property
    def tokenizer(self):
        return self.source.tokenizer

    def add_request(self, prompt, sampling_params=None, priority: int = 0) -> int:
        """Queue one request (a str or a list of token ids); returns its id. Checked at once.
        Lower priority values run first; equal ones in arrival order."""
        self._check_driver()
        [(ids, params)] = self._prepare([prompt], sampling_params)
        return self._add(Sequence(next(self._seq_ids), ids, params, time.perf_counter(), check_priority(priority)))

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[tuple[int, Output]]:
        """Run one step (decodes, their drafts, and prefill chunks); return (request id, Output) of
        requests it finished. Tensor-parallel: every rank runs it, after rank 0's ops."""
        if self.tp is None:
            return self._step()
        self._check_driver()
        with uninterrupted():            # a Ctrl-C lands after the step, never inside a collective
            try:
                self.tp.send("step", self._ops)
                self._ops = []
                return self._step()
            except (RuntimeError, ConnectionError) as e:
                if self.tp.broken(e):        # a rank died, hangs, or its link broke
                    raise self.tp.fail(e) from e
                raise

    def _step(self) -> list[tuple[int, Output]]:
        with stage("schedule"):
            plan = self.scheduler.schedule()
            self._swap(plan)
        if not plan.seqs:
            return []
        with stage("schedule"):                # drafting plans the step's rows too
            scored = self.speculator.draft(plan)
        return self._commit(self.scheduler, plan.seqs, self.runner.run(plan, scored), scored)

    def _swap(self, plan: StepPlan) -> None:
        """The copies a plan asks for, before the forward writes anything: resumed sequences'
        K/V back into their new blocks first, then preempted ones' out of the blocks they left
        (a sequence resumed and preempted again in one plan is restored, then saved)."""
        for seq, blocks in plan.swap_in:
            self.cache.restore(blocks, self.swapped_kv.pop(seq.seq_id))
        for seq, blocks in plan.swap_out:
            self.swapped_kv[seq.seq_id] = self.cache.save(blocks)

    def _commit(self, scheduler: Scheduler, seqs: list[Sequence], logits: torch.Tensor,
                scored: list[int] | None = None) -> list[tuple[int, Output]]:
        """logits (R, vocab) of a step over seqs, scored[b] rows each (default 1; a verify's 1 + k):
        sample or verify, append, roll back, and retire the finished requests. A prompt whose step
        was not its last chunk samples nothing: its row's logits are dropped.
        The step's K/V is written now: its full blocks join the prefix cache first (blocks of real
        tokens only: a draft's position joins once the draft is kept, a token like any other)."""
        scheduler.written(seqs)
        scored = scored or [1] * len(seqs)
        spans = [(end - n, end) for n, end in zip(scored, itertools.accumulate(scored))]
        rows = [i for i, seq in enumerate(seqs) if seq.num_pending_tokens <= 0]   # (a verify's is -k)
        seqs, spans = [seqs[i] for i in rows], [spans[i] for i in rows]
        with stage("sampling"):
            tokens = self._choose(seqs, logits, spans)
        with stage("output handling"):
            now = time.perf_counter()          # a verify's tokens arrive together: one time for all
            eos = self.source.eos_token_ids    # (a property: read it once per step)
            for seq, new in zip(seqs, tokens):
                for token in new:
                    if not seq.finished:       # EOS, a stop string or max_tokens inside the drafts
                        seq.append(token, now, eos, self._detokenize)
                self.speculator.rollback(seq, len(new))
            done = scheduler.finish(seqs)                            # their blocks are free again
            for seq in done:
                del self.generators[seq.seq_id]
                del self.requests[seq.seq_id]
                self.speculator.release(seq)
            return [(seq.seq_id, self._output(seq)) for seq in done]

    def _choose(self, seqs: list[Sequence], logits: torch.Tensor, spans) -> list[list[int]]:
        """Each sequence's new tokens: verified drafts, or one sampled token. Sampling happens once,
        on rank 0, which sends the tokens; the other ranks take them (every rank holds the same
        logits, but a sampler's random numbers are drawn in one place only)."""
        if self.tp is not None and not self.tp.driver:
            return self.tp.receive_tokens()
        generators = [self.generators[s.seq_id] for s in seqs]
        tokens = self.speculator.verify(seqs, logits, spans, generators)   # None: no drafts, one token
        plain = [i for i, new in enumerate(tokens) if new is None]
        last = [spans[i][1] - 1 for i in plain]
        sampled = sample_batch(logits if len(last) == len(logits) else logits[last], [seqs[i].params for i in plain],
                               [generators[i] for i in plain]) if plain else []
        for i, token in zip(plain, sampled):
            tokens[i] = [token]
        if self.tp is not None:
            self.tp.send("tokens", tokens)
        return tokens

    def generate(self, prompts, sampling_params=None, use_tqdm: bool = False,
                 priorities: list[int] | None = None) -> list[Output]:
        """prompts: a str, a list of token ids, or a list of either. Outputs keep their order.
        priorities: one per prompt (lower runs first), default all 0."""
        self._check_driver()
        if self._failed:                # the last call failed, and its clean-up was cut short too
            self.recover()
        if self.has_unfinished():
            raise RuntimeError("generate() needs an idle engine; step() the requests added with "
                               "add_request() to completion first")
        now = time.perf_counter()   # offline: every request arrives now
        requests = self._prepare(prompts, sampling_params)
        priorities = check_priorities(priorities, len(requests))
        seqs = [Sequence(next(self._seq_ids), ids, p, now, pri) for (ids, p), pri in zip(requests, priorities)]
        for i, seq in enumerate(seqs):          # every request is checked before any work starts
            self.scheduler.check_fits(seq, f"request {i}")
        self._last_call, self._failed = seqs, True     # (until the loop below has ended)
        try:
            ids, outputs = [self._add(seq) for seq in seqs], {}
            with tqdm(total=len(seqs), disable=not use_tqdm, desc="requests") as bar:
                while self.has_unfinished():
                    outputs.update(finished := self.step())
                    bar.update(len(finished))
        except BaseException:   # failed or Ctrl-C, perhaps halfway through the bookkeeping: no
            self.recover()      # request of the call may stay, and the accounting must be whole
            raise
        self._failed = False
        return [outputs[i] for i in ids]

    def recover(self) -> None:
        """Make the engine whole after a failure: an error or a Ctrl-C anywhere in a step, the
        block bookkeeping included (several statements, any of which a Ctrl-C can fall between).
        Drop generate()'s requests, then rebuild the block accounting from scratch (nobody holds
        a block then) rather than trust what a cut-short update left. generate() calls it when a
        call fails, and again at the next call if a second Ctrl-C cut this short; a step() user
        aborts their own requests first, then calls it."""
        self._failed = True
        self.speculator.rebuild()              # drafts in flight, a draft model's own pool
        if self.runner.graphs is not None:     # the lanes' host rows, written part way
            self.runner.graphs.forget()
        self._abort(self._last_call)
        if self.has_unfinished():
            raise RuntimeError("recover() needs an idle engine: abort the requests added with add_request() first")
        self._rebuild()
        self._record("recover")
        self._failed = False

    def _rebuild(self) -> None:
        """The block accounting from scratch. Tensor-parallel: the prefix cache goes too, on every
        rank (a step cut short may have cached blocks on one rank and not another)."""
        self.scheduler.block_manager.rebuild()
        if self.tp is not None:
            self.scheduler.block_manager.reset_cache()

    def check(self) -> None:
        """Raise AssertionError where the block accounting is not whole (scheduler.py). Tests
        call it after every call."""
        self.scheduler.check()
        self.speculator.check(set(self.requests))

    def _prepare(self, prompts, sampling_params):
        return prepare_requests(prompts, sampling_params, self._encode,
                                self.model_config.vocab_size, self.max_model_len, self.detokenize)

    def _add(self, seq: Sequence) -> int:
        self._record("add", seq.seq_id, seq.prompt_ids, seq.params, seq.arrival_time, seq.priority)
        self.scheduler.add(seq)
        self.generators[seq.seq_id] = make_generator(seq.params, self.device)
        self.requests[seq.seq_id] = seq
        return seq.seq_id

    def abort_request(self, request_id: int) -> None:
        """Drop one request added with add_request() (a client went away): its KV blocks are free
        when this returns. A request that already finished is left alone."""
        seq = self.requests.get(request_id)
        if seq is not None:
            self._abort([seq])

    def _abort(self, seqs: list[Sequence]) -> None:
        """Drop these requests wherever they are (waiting or running) and free their KV blocks."""
        self._record("abort", [seq.seq_id for seq in seqs])
        for seq in seqs:
            self.scheduler.abort(seq)
            self.speculator.release(seq)
            self.generators.pop(seq.seq_id, None)
            self.requests.pop(seq.seq_id, None)
            self.swapped_kv.pop(seq.seq_id, None)

    def reset_prefix_cache(self) -> int:
        """Drop every cached block no request reads (a cold cache for the next request); how many."""
        self._record("reset")
        return self.scheduler.block_manager.reset_cache()

    # --- tensor parallelism: rank 0 records, the other ranks replay ----------------------------
    def _record(self, *op) -> None:
        """Rank 0: remember an op the other ranks must apply before the next step."""
        if self.tp is not None and self.tp.driver:
            self._ops.append(op)

    def _check_driver(self) -> None:
        if self.tp is not None:
            self.tp.check()
            if not self.tp.driver:
                raise RuntimeError(f"rank {self.tp.rank} follows rank 0: call follow(), not generate() or step()")

    def follow(self) -> None:
        """Ranks 1..N-1: apply rank 0's ops and run each step with it, until it shuts down."""
        message = self.tp.receive()
        while message[0] != "stop":
            try:
                for op in message[1]:
                    self._apply(*op)
                self._step()
                message = self.tp.receive()
            except Resync as resync:         # rank 0's step failed after the forward: its
                message = resync.message     # recover() is in the next message
        self.tp.close()

    def _apply(self, kind: str, *args) -> None:
        if kind == "add":
            seq_id, ids, params, arrival, priority = args
            self._add(Sequence(seq_id, ids, params, arrival, priority))
        elif kind == "abort":
            self._abort([self.requests[i] for i in args[0] if i in self.requests])
        elif kind == "reset":
            self.reset_prefix_cache()
        elif kind == "recover":
            self.speculator.rebuild()
            if self.runner.graphs is not None:
                self.runner.graphs.forget()
            self._rebuild()

    def shutdown(self) -> None:
        """Stop the other ranks and leave the process groups (nothing to do on one device)."""
        if self.tp is not None:
            self._stop_ranks()

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def _detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids) if self.detokenize else ""

    def _output(self, seq: Sequence) -> Output:
        text = seq.stop_text if seq.stop_text is not None else self._detokenize(seq.output_ids)
        return Output(seq.prompt_ids, seq.output_ids, text, seq.finish_reason,
                      seq.arrival_time, seq.token_times)


def check_priority(priority) -> int:
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError(f"priority must be an integer (lower runs first), got {priority!r}")
    return priority


def check_priorities(priorities: list[int] | None, num_prompts: int) -> list[int]:
    """generate()'s priorities (LLM's and ParallelLLM's): one per prompt, default all 0."""
    if priorities is None:
        return [0] * num_prompts
    priorities = [check_priority(p) for p in priorities]
    if len(priorities) != num_prompts:
        raise ValueError(f"{len(priorities)} priorities for {num_prompts} prompts")
    return priorities
