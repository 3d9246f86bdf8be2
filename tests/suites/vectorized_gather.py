"""The vectorized gather: the keys a per-sequence reference reads, the previous phase's tokens,
and a number of ops that does not grow with the batch."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from common.sampling import SamplingParams


BLOCK = 4
OPTIONS = dict(device="cpu", dtype="float32", block_size=BLOCK, cpu_kv_cache_bytes=1 << 20)


def run_staggered(llm, prompts, params, arrivals):
    """Requests added just before the steps named in `arrivals`; token ids in prompt order."""
    ids, outputs, n = {}, {}, 0
    while n <= max(arrivals) or llm.has_unfinished():
        for i in arrivals.get(n, []):
            ids[llm.add_request(prompts[i], params[i])] = i
        outputs.update(llm.step())
        n += 1
    return [outputs[rid].token_ids for rid in sorted(ids, key=ids.get)]


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])
def test_same_tokens_as_previous_phase(preset, prompts_for, LLM, PrevLLM):
    """Mixed lengths (9, 32, 32, 600), staggered arrivals, different max_tokens, greedy and seeded
    sampled requests: token for token what the per-sequence loop produces."""
    prompts = prompts_for(preset)
    params = [SamplingParams(temperature=0, max_tokens=48, ignore_eos=True),
              SamplingParams(temperature=0.8, top_p=0.9, max_tokens=40, seed=5, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)]
    arrivals = {0: [3], 1: [0], 4: [1, 2]}
    new = run_staggered(LLM(preset, **OPTIONS), prompts, params, arrivals)
    old = run_staggered(PrevLLM(preset, **OPTIONS), prompts, params, arrivals)
    assert new == old
    assert [len(t) for t in new] == [p.max_tokens for p in params]


@pytest.fixture(scope="module")
def llm(LLM):
    return LLM("tiny-llama", **OPTIONS)


def decoding(tables, lens, Sequence):
    """Sequences about to decode: context_lens[b] tokens, the last one's K/V written this step."""
    seqs = []
    for i, (table, n) in enumerate(zip(tables, lens)):
        seq = Sequence(i, list(range(n - 1)), SamplingParams(max_tokens=64), 0.0)
        seq.output_ids, seq.block_table = [0], list(table)
        seqs.append(seq)
    return seqs


def test_gather_equals_a_per_sequence_reference(llm, Sequence):
    """Scattered, out-of-order block tables and lengths that end mid-block: each sequence's rows
    equal its blocks read one by one; rows past its length are masked out."""
    tables, lens = [[7, 2, 30, 11], [5], [0, 19, 3]], [15, 1, 9]
    torch.manual_seed(0)
    for layer in llm.cache.layers:
        layer.copy_(torch.randn_like(layer))
    _, step = llm.runner.prepare_decode(decoding(tables, lens, Sequence))
    mask = step.key_mask[:, 0, 0]                       # bool, or additive: 0 = a real key
    real = mask if mask.dtype == torch.bool else mask == 0
    assert real.tolist() == [[j < n for j in range(15)] for n in lens]
    for i, layer in enumerate(llm.cache.layers):
        k, v = llm.cache.gather(i, step)
        assert k.shape == v.shape == (3, 15, 2, 16)
        for b, (table, n) in enumerate(zip(tables, lens)):
            assert torch.equal(k[b, :n], layer[0, table].flatten(0, 1)[:n])
            assert torch.equal(v[b, :n], layer[1, table].flatten(0, 1)[:n])


class OpCounter(TorchDispatchMode):
    """Counts the aten ops (each a kernel launch on a GPU) run while active."""

    def __enter__(self):
        self.ops = 0
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def ops_per_gather(engine, batch: int, Sequence) -> int:
    seqs = decoding([[b] for b in range(batch)], [BLOCK] * batch, Sequence)
    _, step = engine.runner.prepare_decode(seqs)
    with OpCounter() as counter:
        engine.cache.gather(0, step)
    return counter.ops


def test_gather_ops_do_not_grow_with_the_batch(llm, PrevLLM, Sequence):
    """The same few ops for 1 or 32 sequences; the previous phase's loop adds ops per sequence."""
    assert ops_per_gather(llm, 1, Sequence) == ops_per_gather(llm, 32, Sequence)
    prev = PrevLLM("tiny-llama", **OPTIONS)
    assert ops_per_gather(prev, 32, Sequence) > 16 * ops_per_gather(llm, 32, Sequence)
