"""p06_paged_attention: attention behind backends, reading the pool through block tables; the
decode step reads no device value back; the previous phase's tokens exactly."""
import importlib
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from common.sampling import SamplingParams
# The previous phase's tokens, token for token (mixed lengths, staggered arrivals, greedy and
# seeded sampling): the shared test, run here with PHASE and PREVIOUS below.
from tests.suites.vectorized_gather import decoding, test_same_tokens_as_previous_phase  # noqa: F401

PHASE, PREVIOUS = "p06_paged_attention", "p05_decode_profiling"
engine = importlib.import_module(f"phases.{PHASE}")
backends = importlib.import_module(f"phases.{PHASE}.attention_backends")
Sequence = importlib.import_module(f"phases.{PHASE}.sequence").Sequence
OPTIONS = dict(device="cpu", dtype="float32", block_size=4, cpu_kv_cache_bytes=1 << 20)


def reference_decode(q, k_pages, v_pages, tables, lens):
    """Attention of each sequence's one query over its keys, read block by block, in float64."""
    G = q.shape[1] // k_pages.shape[2]
    out = []
    for b, (table, n) in enumerate(zip(tables, lens)):
        k = k_pages[table].flatten(0, 1)[:n].double().repeat_interleave(G, dim=1)     # (n, H, D)
        v = v_pages[table].flatten(0, 1)[:n].double().repeat_interleave(G, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].double(), k) / math.sqrt(q.shape[-1])
        out.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), v))
    return torch.stack(out)


def test_torch_decode_equals_a_per_sequence_reference():
    """Scattered, out-of-order block tables and lengths that end mid-block, garbage in the slots
    past each sequence's end: the backend's output equals attention over exactly its own keys."""
    llm = engine.LLM("tiny-llama", **OPTIONS)
    tables, lens = [[7, 2, 30, 11], [5], [0, 19, 3]], [15, 1, 9]
    torch.manual_seed(0)
    pages = torch.randn_like(llm.cache.layers[0])                     # (2, blocks, 4, KV, D)
    _, step = llm.runner.prepare_decode(decoding(tables, lens, Sequence))
    q = torch.randn(3, 4, 16)                                          # (B, H, D), 4 heads over 2 KV heads
    out = step.backend.decode(q, pages[0], pages[1], step)
    assert out.shape == (3, 4, 16)
    assert torch.allclose(out.double(), reference_decode(q, pages[0], pages[1], tables, lens), atol=1e-5)


class SyncCounter(TorchDispatchMode):
    """Counts ops that make a GPU's host wait for the device (a value read back, or an output
    whose size depends on device data). On CPU they are free, but they are the same calls."""
    SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "item"}

    def __enter__(self):
        self.syncs = []
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in self.SYNCING:
            self.syncs.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_decode_step_reads_nothing_back_and_copies_its_inputs_once(monkeypatch):
    """A whole decode forward (inputs, every layer, the head) has no syncing op, and its inputs
    reach the device in one copy; the sampler's fetch of the token ids is the step's one sync."""
    llm = engine.LLM("tiny-llama", **OPTIONS)
    for _ in range(3):
        llm.add_request(list(range(5, 30)), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    llm.step()                                                        # prefill
    uploads = []
    real_upload = llm.runner.upload
    monkeypatch.setattr(llm.runner, "upload", lambda *lists: uploads.append(len(lists)) or real_upload(*lists))
    with SyncCounter() as counter:
        llm.runner.run(llm.scheduler.running, is_prefill=False)
    assert counter.syncs == [] and uploads == [6]


class OpRecorder(TorchDispatchMode):
    """Records the name of every op dispatched inside it."""
    def __enter__(self):
        self.ops = []
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


def test_the_layers_derive_nothing_from_the_step():
    """What a backend derives from the step's metadata (the torch backend's int64 gather index
    and its mask) is made once in prepare(): the layers of a decode forward convert no dtype
    (a .long() per layer would be two more launches per layer on a GPU)."""
    llm = engine.LLM("tiny-llama", **OPTIONS)
    for _ in range(3):
        llm.add_request(list(range(5, 30)), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    llm.step()                                                        # prefill
    ids, step = llm.runner.prepare_decode(llm.scheduler.running)
    with OpRecorder() as recorder:
        llm.runner.model(ids, step)
    assert "_to_copy" not in recorder.ops and recorder.ops.count("index") == 2 * llm.model_config.num_layers + 1


def test_backend_choice_is_checked_at_construction():
    assert engine.LLM("tiny-llama", **OPTIONS).config.attention_backend == "torch"    # auto, on CPU
    with pytest.raises(ValueError, match="needs a CUDA device"):
        engine.LLM("tiny-llama", **OPTIONS, attention_backend="flash-attn")
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        engine.LLM("tiny-llama", **OPTIONS, attention_backend="sdpa")


@pytest.mark.gpu
def test_flash_attn_matches_torch_on_the_gpu():
    """bf16 on llama-1b random weights: the paged FlashAttention backend gives the torch
    reference's logits within bf16 tolerance, and the same greedy tokens where they agree."""
    pytest.importorskip("flash_attn.cute")
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    prompts = [list(range(100, 100 + n)) for n in (7, 33, 200)]
    outs = {name: engine.LLM("llama-1b", device="cuda", attention_backend=name, kv_cache_bytes=1 << 30,
                             detokenize=False)
            .generate(prompts, params) for name in ("torch", "flash-attn")}
    agree = [a.token_ids[:8] == b.token_ids[:8] for a, b in zip(outs["torch"], outs["flash-attn"])]
    assert all(agree)
