"""Speculative decoding: drafts verified in one step change nothing about the tokens, and
rejection sampling gives the target's distribution.

Greedy: HF's tokens on tiny-llama, and on the real SmolLM2 (which the previous phase gives) for
k = 1, 2, 4, 8 and both proposers (prompt lookup, a self-draft); a draft refused at its first, a
middle and its last position; EOS, a stop string and max_tokens inside a proposal; rollback
within a block, across blocks and of every draft, with every slot past a sequence's kept length
poisoned after each step (a rejected draft's K/V is never read, the bonus token's is written
before anything reads it); no draft in the prefix cache, and what it caches from kept drafts is
right; the switch; the counters on /metrics.

Sampling: on a vocabulary of 6 tokens, with fixed target logits per position and a draft
distribution q unlike the target's p (and a deterministic draft, q one-hot), the tokens verify()
emits over N draws are compared with p by Pearson's chi-square test. Each such test's false-alarm
rate is ALPHA = 0.001: on a correct sampler it fails once in a thousand seeds (the seeds are
fixed, so a given run passes or fails for good). A sampler that kept every draft fails it by many
orders of magnitude (checked below).
"""

import importlib
from types import SimpleNamespace

import pytest
import torch

from common.sampling import SamplingParams
from common.spec_decode import Draft
from tests.reference import real_pool

BLOCK = 4
# tiny-llama's pool: 8192 tokens at 512 bytes each, room for every test here (the self-draft's
# share included). Its default (max_num_seqs x max_model_len, 256 MiB) is zeroed at each build,
# a quarter of a second of the ~30 engines this suite builds per phase.
TINY_POOL = {"cpu_kv_cache_bytes": 4 << 20}


def engine(phase: str, preset: str = "tiny-llama", **options):
    LLM = importlib.import_module(f"phases.{phase}").LLM
    pool = TINY_POOL if preset == "tiny-llama" else real_pool(phase, preset)
    return LLM(preset, device="cpu", dtype="float32", **pool | options)


def greedy(n: int = 24, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) if not kw else \
        SamplingParams(temperature=0, max_tokens=n, **kw)


def check_idle(llm):
    bm = llm.scheduler.block_manager
    assert not llm.has_unfinished() and llm.generators == {} and llm.requests == {}
    assert bm.num_free_blocks == bm.num_blocks and not bm.owners


class MissAt:
    """Drafts the target's own greedy continuation (`truth`: prompt -> tokens) with draft position
    `miss` replaced by a wrong token (None: every draft right)."""

    def __init__(self, truth: dict, miss: int | None, vocab: int):
        self.truth, self.miss, self.vocab = truth, miss, vocab

    def propose(self, seqs, k):
        drafts = []
        for seq in seqs:
            ids = list(self.truth.get(tuple(seq.prompt_ids), [])[len(seq.output_ids):][:k])
            if self.miss is not None and self.miss < len(ids):
                ids[self.miss] = (ids[self.miss] + 1) % self.vocab
            drafts.append(Draft(ids))
        return drafts

    def release(self, seq):
        pass


def scripted(phase: str, truth: dict, miss: int | None, k: int, **options):
    llm = engine(phase, speculative="ngram", num_speculative_tokens=k, block_size=BLOCK, **options)
    llm.speculator.proposer = MissAt(truth, miss, llm.model_config.vocab_size)
    return llm


def poison_past_length(llm):
    """After every rollback, a huge finite value in every slot of a sequence's blocks past its kept
    K/V: a step that read a rejected draft's slot, or the bonus token's before writing it, would
    see that key outweigh every other (not NaN: the decode path multiplies masked slots by 0)."""
    rollback, bs = llm.speculator.rollback, llm.cache.block_size

    def poisoned(seq, num_new):
        rollback(seq, num_new)
        assert len(seq.block_table) <= -(-seq.num_tokens // bs), "a block past the new length kept"
        slots = [b * bs + o for b in seq.block_table for o in range(bs)][seq.num_computed_tokens:]
        for layer in llm.cache.layers:
            layer.flatten(1, 2)[:, slots] = 1e4
    llm.speculator.rollback = poisoned


@pytest.fixture(scope="module")
def tiny_prompts(prompts_for):
    return prompts_for("tiny-llama")[:4]


@pytest.fixture(scope="module")
def plain(phase):
    """Speculation off (the engine of tiny_truth; tests that only read from it share it)."""
    return engine(phase, block_size=BLOCK)


@pytest.fixture(scope="module")
def tiny_truth(plain, tiny_prompts):
    """Speculation off: the tokens every engine here must give, and the script of the proposers."""
    outs = plain.generate(tiny_prompts, greedy())
    return {tuple(p): o.token_ids for p, o in zip(tiny_prompts, outs)}


# --- HF's greedy tokens --------------------------------------------------------------------------
HF_TOKENS = 16        # HF's first 16: on the real model n-gram drafts have 5 tokens accepted by then (by 24: 6)
DRAFT_LAYERS = {"smollm2-135m": 2, "tiny-llama": 1}     # the self-draft: the target's first layers


def speculative_counters(phase: str, preset: str, proposer: str, k: int, hf_prefix) -> dict:
    """Every reference prompt of the preset in one batch, drafted by `proposer` k tokens a step:
    HF's greedy tokens, drafts made and verified, the engine idle after. Returns the counters."""
    prompts, expected = hf_prefix(preset, HF_TOKENS)
    options = {"draft_num_layers": DRAFT_LAYERS[preset]} if proposer == "draft" else {}
    llm = engine(phase, preset, speculative=proposer, num_speculative_tokens=k, **options)
    outs = llm.generate(prompts, greedy(HF_TOKENS))
    assert [o.token_ids for o in outs] == expected
    c = llm.speculator.counters()
    assert c["spec_decode_num_drafts"] > 0, c
    assert c["spec_decode_num_accepted_tokens"] <= c["spec_decode_num_draft_tokens"] <= k * c["spec_decode_num_drafts"]
    check_idle(llm)
    return c


@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_tiny_model_tokens_are_hfs(phase, proposer, hf_prefix):
    """tiny-llama's reference prompts (random ids, one of 600 tokens) in one batch, k = 4: HF's
    tokens through either proposer. Its random weights rarely keep a draft (prompt lookup finds
    few n-grams in these prompts, the 1-layer self-draft a few kept tokens): drafts kept is the
    real model's test below, and the scripted proposer's tests further down."""
    speculative_counters(phase, "tiny-llama", proposer, 4, hf_prefix)


@pytest.mark.speculator_code
@pytest.mark.parametrize("k", [pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow), 4,
                               pytest.param(8, marks=pytest.mark.slow)])
@pytest.mark.parametrize("proposer", ["ngram", pytest.param("draft", marks=pytest.mark.slow)])
def test_real_model_tokens_are_hfs(phase, proposer, k, hf_prefix):
    """SmolLM2's reference set (chat, plain, code, non-ASCII, > 512 tokens) in one batch. The
    self-draft keeps 2 of SmolLM2's 30 layers (cheap here; it rarely agrees, which changes
    nothing about the tokens). Prompt lookup has drafts kept here (the chat answers repeat), which
    tiny-llama's random text never gives: `make test` runs n-gram k = 4 where the speculator, the
    proposers or the sampler's verify changed (marked speculator_code, tests/selection.py MARKED);
    `make test-all` every k and both proposers in every phase."""
    c = speculative_counters(phase, "smollm2-135m", proposer, k, hf_prefix)
    assert c["spec_decode_num_accepted_tokens"] > 0 or proposer == "draft", c


# --- where the first refused draft is ------------------------------------------------------------
def test_refused_draft_at_each_position(phase, tiny_prompts, tiny_truth):
    """k = 5 drafts per step: refused at position 0 (all rolled back), 2, 4 (the last), or never
    (every draft kept, and the bonus token's K/V written by the next step). Tokens unchanged; each
    verify keeps exactly the drafts before the refused one. One engine runs the four scripts in
    turn (a script is the proposer's alone), each starting from the idle engine the last one left."""
    llm = scripted(phase, tiny_truth, None, k=5)
    poison_past_length(llm)
    verifies, count = [], llm.speculator.count
    llm.speculator.count = lambda drafted, accepted: (verifies.append((drafted, accepted)), count(drafted, accepted))
    for miss in (0, 2, 4, None):
        llm.speculator.proposer, verifies[:] = MissAt(tiny_truth, miss, llm.model_config.vocab_size), []
        outs = llm.generate(tiny_prompts, greedy())
        assert [o.token_ids for o in outs] == list(tiny_truth.values()), f"miss at {miss}"
        assert verifies and any(drafted == 5 for drafted, _ in verifies)
        expected = [min(drafted, 5 if miss is None else miss) for drafted, _ in verifies]
        assert [accepted for _, accepted in verifies] == expected, f"miss at {miss}"   # (a draft cut short
        check_idle(llm)                                                 # by max_tokens may end before the miss)


@pytest.mark.parametrize("k", [1, 3, pytest.param(4, marks=pytest.mark.slow), 7])
def test_rollback_within_and_across_blocks(phase, k, tiny_prompts, tiny_truth):
    """Block size 4: k + 1 rows per verify start anywhere in a block, so rejected positions lie in
    the newest block only (k = 1), or reach one or two blocks further (k = 3, 4, 7); a miss in the
    middle leaves blocks that begin past the kept length, which must go back to the pool. `make
    test` runs k = 1, 3 (the first k to free a whole block) and 7; k = 4 is between them."""
    llm = scripted(phase, tiny_truth, k // 2, k=k)
    poison_past_length(llm)
    freed = []
    truncate = llm.scheduler.block_manager.truncate

    def counting(seq, n):
        before = len(seq.block_table)
        truncate(seq, n)
        freed.append(before - len(seq.block_table))
    llm.scheduler.block_manager.truncate = counting
    outs = llm.generate(tiny_prompts, greedy())
    assert [o.token_ids for o in outs] == list(tiny_truth.values())
    assert (max(freed) > 0) == (k >= BLOCK - 1), freed      # whole blocks of rejected drafts only from k >= 3
    check_idle(llm)


def test_block_manager_truncate_frees_only_blocks_past_the_length(phase):
    bm = importlib.import_module(f"phases.{phase}.block_manager").BlockManager(8, 4)
    seq = SimpleNamespace(seq_id=0, block_table=[])
    bm.allocate(seq, 0)
    bm.grow(seq, 13)                            # positions [0, 13): 4 blocks
    table = list(seq.block_table)
    bm.truncate(seq, 9)                          # position 8 lives in block 2: it stays
    assert seq.block_table == table[:3] and bm.num_free_blocks == 5
    bm.truncate(seq, 8)                          # block 2 begins at 8: freed
    assert seq.block_table == table[:2] and bm.num_free_blocks == 6
    bm.truncate(seq, 0)
    assert seq.block_table == [] and bm.num_free_blocks == 8


# --- the prefix cache -----------------------------------------------------------------------------
def cached_paths(tree) -> list[list[int]]:
    """The token ids spelled by every root-to-node path of a radix tree."""
    out, stack = [], [(tree.root, [])]
    while stack:
        node, ids = stack.pop()
        for child in node.children.values():
            out.append(ids + list(child.key))
            stack.append((child, out[-1]))
    return out


def test_drafts_never_enter_the_prefix_cache(phase, previous, tiny_prompts, tiny_truth):
    """Every cached block spells real tokens of a request (rejected drafts never, kept ones only
    once they are tokens); prompts that extend those requests then read the blocks cached from
    kept drafts and give the tokens of an engine without speculation or cache."""
    llm = scripted(phase, tiny_truth, 2, k=5)
    llm.generate(tiny_prompts, greedy())
    real = [list(p) + t for p, t in tiny_truth.items()]
    paths = cached_paths(llm.scheduler.block_manager.tree)
    assert paths and all(any(r[:len(path)] == path for r in real) for path in paths)
    assert max(map(len, paths)) > max(map(len, tiny_prompts))       # blocks of kept drafts are cached
    longer = [r[:-4] for r in real]
    again = llm.generate(longer, greedy(8))
    assert llm.scheduler.cache_hits > 0
    plain = engine(previous, block_size=BLOCK, enable_prefix_caching=False).generate(longer, greedy(8))
    assert [o.token_ids for o in again] == [o.token_ids for o in plain]
    check_idle(llm)


# --- where a request ends inside a proposal --------------------------------------------------------
def test_eos_inside_a_proposal(phase, plain, tiny_prompts, tiny_truth, monkeypatch):
    """EOS is the 3rd token the drafts would bring: the request stops there, as without them."""
    prompt = tiny_prompts[0]
    eos = tiny_truth[tuple(prompt)][4]
    outs = []
    for llm in (plain, scripted(phase, tiny_truth, None, k=6)):
        monkeypatch.setattr(llm, "source", SimpleNamespace(eos_token_ids=[eos], tokenizer=llm.source.tokenizer))
        outs.append(llm.generate([prompt], greedy(24, ignore_eos=False))[0])
        check_idle(llm)
    assert outs[0].token_ids == outs[1].token_ids and outs[1].finish_reason == "stop"
    assert outs[1].token_ids[-1] == eos and len(outs[1].token_ids) < 24


def test_stop_string_inside_a_proposal(phase, plain, tiny_prompts, tiny_truth):
    prompt = tiny_prompts[1]
    base = plain
    text = base.tokenizer.decode(tiny_truth[tuple(prompt)][:6])
    stop = text[-3:].strip() or text[-4:]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop])
    spec = scripted(phase, tiny_truth, None, k=8)
    a, b = base.generate([prompt], params)[0], spec.generate([prompt], params)[0]
    assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason) and b.finish_reason == "stop"
    check_idle(spec)


def test_max_tokens_inside_a_proposal(phase, tiny_prompts, tiny_truth):
    """k = 8 drafts but only max_tokens - 1 - (tokens so far) can still be verified: the request
    ends at max_tokens exactly, on a verify's last token (max_tokens 1, 2, 5, 6 in turn, one engine)."""
    llm = scripted(phase, tiny_truth, None, k=8)
    for max_tokens in (1, 2, 5, 6):
        outs = llm.generate(tiny_prompts, greedy(max_tokens))
        assert [o.token_ids for o in outs] == [t[:max_tokens] for t in tiny_truth.values()], max_tokens
        assert all(o.finish_reason == "length" for o in outs)
        check_idle(llm)


# --- the switch ----------------------------------------------------------------------------------
def test_switch_drafts_only_at_small_batches(phase, tiny_prompts, tiny_truth):
    """speculative_disable_by_batch_size=2: no drafts while more than 2 sequences decode."""
    llm = scripted(phase, tiny_truth, None, k=4, speculative_disable_by_batch_size=2)
    sizes, draft = [], llm.speculator.draft

    def recording(plan):
        scored = draft(plan)
        sizes.append((len(llm.speculator.decoding), sum(n > 1 for n in scored)))
        return scored
    llm.speculator.draft = recording
    params = [greedy(8), greedy(24), greedy(8), greedy(8)]
    outs = llm.generate(tiny_prompts, params)
    assert [o.token_ids for o in outs] == [t[:p.max_tokens] for t, p in zip(tiny_truth.values(), params)]
    assert all(drafted == 0 for decoding, drafted in sizes if decoding > 2)
    assert any(drafted > 0 for decoding, drafted in sizes if decoding <= 2)


def record_step_sizes(runner) -> list[int]:
    """Wrap runner.run: the tokens each of its forwards computes, in order."""
    sizes, run = [], runner.run

    def recording(plan, *args):
        sizes.append(sum(plan.num_new_tokens))
        return run(plan, *args)
    runner.run = recording
    return sizes


@pytest.mark.parametrize("proposer", ["scripted", "draft"])
def test_no_step_exceeds_the_token_budget(phase, proposer, tiny_prompts, tiny_truth):
    """Drafts count against max_num_batched_tokens like any token: with a budget of 12 and eight
    sequences decoding, each step has 4 tokens left for drafts. The self-draft's forwards keep to
    the budget too, catching up on a whole prompt in chunks of it (the 32-token prompts are longer;
    the 600-token one would add 50 chunks a copy, each alike)."""
    options = dict(max_num_seqs=8, max_num_batched_tokens=12)
    llm = scripted(phase, tiny_truth, None, k=7, **options) if proposer == "scripted" else \
        engine(phase, block_size=BLOCK, speculative="draft", num_speculative_tokens=7, **options)
    sizes = record_step_sizes(llm.runner)
    drafts = record_step_sizes(llm.speculator.proposer.runner) if proposer == "draft" else []
    prompts = ([p for p in tiny_prompts if len(p) < 100] * 3)[:8]
    outs = llm.generate(prompts, greedy())
    assert [o.token_ids for o in outs] == [tiny_truth[tuple(p)] for p in prompts]
    assert max(sizes) <= 12 and (proposer == "scripted" or max(drafts) <= 12)
    assert llm.speculator.counters()["spec_decode_num_draft_tokens"] > 0
    llm.check()


def test_a_self_draft_shares_the_kv_budget(phase):
    """The self-draft's pool has as many blocks as the target's and both fit the one budget
    (on a GPU: the share of free memory gpu_memory_utilization gives, not twice it)."""
    budget = 1 << 20
    llm = engine(phase, speculative="draft", kv_cache_bytes=budget)
    draft = llm.speculator.proposer
    bytes_per_block = sum(layer[:, 0].numel() * layer.element_size()
                          for layer in [*llm.cache.layers, *draft.runner.cache.layers])
    assert draft.blocks.num_blocks == llm.cache.num_blocks
    assert budget - bytes_per_block < llm.cache.num_blocks * bytes_per_block <= budget


def test_off_drafts_nothing(plain, tiny_truth):
    """The engine that gave tiny_truth (speculation off) drafted nothing for it."""
    assert plain.speculator.counters()["spec_decode_num_drafts"] == 0
    check_idle(plain)


# --- the n-gram proposer -------------------------------------------------------------------------
def test_prompt_lookup_proposes_what_followed_the_latest_match(phase):
    ngram = importlib.import_module(f"phases.{phase}.proposers").NgramProposer(min_n=2, max_n=3)
    ctx = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert ngram.lookup(ctx, 3) == [7, 8, 5]          # the latest earlier "1 2 3", not the first
    assert ngram.lookup([4, 5, 6, 7, 5, 6], 4) == [7, 5, 6]   # up to the context's end
    assert ngram.lookup([1, 2, 3, 4], 2) == []        # no suffix seen before
    assert ngram.lookup([5, 1, 2, 6, 6, 2], 2) == []  # a 1-token match is below min_n


# --- sampling under speculation ------------------------------------------------------------------
@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_sampled_requests_reproduce_with_their_seed(phase, proposer, tiny_prompts):
    """Draws of the draft model, acceptance tests and resamples all come from the request's own
    generator: the same seed gives the same tokens again (in the same batch). top_k, not top_p:
    which filter runs plays no part in whose generator draws, and top_p sorts the whole vocabulary
    for every draw (half of this test's time on a CPU); the sampling suite checks top_p."""
    params = [SamplingParams(temperature=0.8, top_k=50, max_tokens=16, seed=s) for s in (1, 2, 3, 4)]
    runs = []
    for _ in range(2):
        llm = engine(phase, speculative=proposer, num_speculative_tokens=3, block_size=BLOCK)
        runs.append([o.token_ids for o in llm.generate(tiny_prompts, params)])
        check_idle(llm)
    assert runs[0] == runs[1] and all(len(t) == 16 for t in runs[0])
    if proposer == "draft":
        assert llm.speculator.counters()["spec_decode_num_drafts"] > 0


def test_metrics_endpoint_names_the_counters(phase):
    metrics = importlib.import_module(f"phases.{phase}.metrics")
    counters = {"spec_decode_num_drafts": 3, "spec_decode_num_draft_tokens": 12, "spec_decode_num_accepted_tokens": 7,
                "spec_decode_num_accepted_tokens_per_pos": [3, 2, 1, 1]}
    fake = SimpleNamespace(observers=[], alive=True, limits={"num_blocks": 10},
                           gauges={"running": 1, "waiting": 0, "swapped": 0, "kv_blocks_free": 5, "preemptions": 0,
                                   "cache_queries": 0, "cache_hits": 0} | counters)
    text = metrics.ServerMetrics(fake).render()
    assert "mini_infer:spec_decode_num_drafts_total 3\n" in text
    assert "mini_infer:spec_decode_num_draft_tokens_total 12\n" in text
    assert "mini_infer:spec_decode_num_accepted_tokens_total 7\n" in text
    assert 'mini_infer:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 2' in text


# --- rejection sampling on a small vocabulary ----------------------------------------------------
# sampler.verify alone, on fixed logits: marked sampler_code, these run where sampler.py changed
# from the phase before (tests/selection.py MARKED), the same function elsewhere
V, N, ALPHA = 6, 20000, 1e-3
PARAMS = SamplingParams(temperature=1.0, seed=0)


@pytest.fixture(scope="module")
def sampler(phase):
    return importlib.import_module(f"phases.{phase}.sampler")


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """P(X >= the statistic) for X chi-square with (cells - 1) degrees of freedom."""
    expected = probs * counts.sum()
    stat = ((counts - expected) ** 2 / expected).sum()
    return torch.special.gammaincc(torch.tensor((len(counts) - 1) / 2, dtype=torch.float64), stat / 2).item()


def target(k: int) -> torch.Tensor:
    """(k + 1, V) fixed target logits, one row per position."""
    return torch.randn(k + 1, V, generator=torch.Generator().manual_seed(1), dtype=torch.float64).float() * 1.5


def draws(sampler, k: int, draft_probs: torch.Tensor | None, steps: int = N, accept_all: bool = False) -> torch.Tensor:
    """(steps, 2): the first two tokens emitted per verify (-1 where only one was)."""
    gen, logits = torch.Generator().manual_seed(7), target(k)
    out = torch.full((steps, 2), -1)
    for s in range(steps):
        if draft_probs is None:                                    # deterministic draft: always token 0.. k-1
            drafts = list(range(k))
        else:
            drafts = [torch.multinomial(draft_probs[j], 1, generator=gen).item() for j in range(k)]
        tokens = drafts + [0] if accept_all else sampler.verify(logits, drafts, draft_probs, PARAMS, gen)
        out[s, :min(2, len(tokens))] = torch.tensor(tokens[:2])
    return out


def q_far_from_p(k: int) -> torch.Tensor:
    return torch.softmax(torch.randn(k, V, generator=torch.Generator().manual_seed(3)) * 2.0, dim=-1)


@pytest.mark.sampler_code
@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled-draft", "one-hot-draft"])
def test_first_token_is_distributed_as_the_target(sampler, deterministic):
    k = 3
    q = None if deterministic else q_far_from_p(k)
    first = draws(sampler, k, q)[:, 0]
    p = torch.softmax(target(k)[0], -1)
    assert chi_square_p_value(torch.bincount(first, minlength=V).double(), p.double()) > ALPHA


@pytest.mark.sampler_code
def test_second_token_given_the_first_is_distributed_as_the_target(sampler):
    """Where the first draft stood, the second token is row 1's sample (the fixed logits make it
    independent of the first): accepted drafts and the resample after them both count."""
    k = 2
    q = q_far_from_p(k)
    pairs = draws(sampler, k, q)
    second = pairs[:, 1][pairs[:, 1] >= 0]
    assert len(second) > N // 10
    p = torch.softmax(target(k)[1], -1)
    assert chi_square_p_value(torch.bincount(second, minlength=V).double(), p.double()) > ALPHA


@pytest.mark.sampler_code
def test_the_test_catches_a_sampler_that_keeps_every_draft(sampler):
    k = 3
    q = q_far_from_p(k)
    first = draws(sampler, k, q, steps=4000, accept_all=True)[:, 0]
    p = torch.softmax(target(k)[0], -1)
    assert chi_square_p_value(torch.bincount(first, minlength=V).double(), p.double()) < 1e-12


@pytest.mark.sampler_code
def test_greedy_verify_keeps_the_agreeing_prefix_and_adds_the_target_token(sampler):
    assert sampler.verify_greedy([5, 6, 7, 8], [5, 6, 9]) == [5, 6, 7]
    assert sampler.verify_greedy([5, 6, 7, 8], [1, 6, 7]) == [5]
    assert sampler.verify_greedy([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]


@pytest.mark.sampler_code
def test_seeded_verify_is_reproducible(sampler):
    logits, q = target(3), q_far_from_p(3)
    runs = [sampler.verify(logits, [1, 2, 3], q, PARAMS, torch.Generator().manual_seed(11)) for _ in range(2)]
    assert runs[0] == runs[1]
