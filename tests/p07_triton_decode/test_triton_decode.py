"""p07_triton_decode: our Triton paged decode kernel, run on CPU in Triton's interpreter
(TRITON_INTERPRET=1 must be set before triton is first imported, so the interpreted checks run in
one fresh process, started once for the module): the float64 reference on awkward sizes with
poisoned outputs, and the engine's tokens."""
import importlib

import pytest

from tests.interpreted import run_interpreted

PHASE = "p07_triton_decode"
bench = importlib.import_module(f"phases.{PHASE}.bench")

# Both interpreted checks in one process (each interpreter start imports torch and triton anew);
# the last stdout line is a JSON object with one entry per check.
INTERPRETED = f"""
import json
import torch
from phases.{PHASE} import LLM, kernel_bench
from common.sampling import SamplingParams
from tests.reference import prompts_for
torch.manual_seed(0)
results = {{"kernel": all(c["ok"] for c in kernel_bench.check("cpu", torch.float32)), "engine": {{}}}}
opts = dict(device="cpu", dtype="float32", block_size=4, cpu_kv_cache_bytes=1 << 20)
params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
          SamplingParams(temperature=0.8, top_p=0.9, max_tokens=16, seed=5, ignore_eos=True)]
for preset in ("tiny-llama", "tiny-qwen2"):
    prompts = prompts_for(preset)[:2]
    runs = [[o.token_ids for o in LLM(preset, attention_backend=b, **opts).generate(prompts, params)]
            for b in ("triton", "torch")]
    results["engine"][preset] = runs[0] == runs[1]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def interpreted() -> dict:
    """The checks of INTERPRETED, run once in a fresh Python with Triton's interpreter on."""
    return run_interpreted(INTERPRETED)


def test_kernel_matches_the_reference_on_awkward_sizes(interpreted):
    """Pages of 1, 5 and 16, GQA groups of 1 to 8, head dims 16 to 128, contexts ending mid-page,
    scattered tables, output poisoned with NaN: every element written, fp32 error under 1e-4."""
    assert interpreted["kernel"] is True


def test_engine_with_the_kernel_gives_the_reference_tokens(interpreted):
    """Greedy and seeded sampled requests of mixed lengths: the triton backend's tokens are the
    torch backend's (fp32), on a Llama and a Qwen2 shape."""
    assert interpreted["engine"] == {"tiny-llama": True, "tiny-qwen2": True}


def test_triton_on_cpu_without_the_interpreter_is_a_clear_error(monkeypatch):
    """Without TRITON_INTERPRET=1 on CPU: a clear ValueError. The backend reads the variable when
    the engine is built, so this process can check it with the variable removed (no interpreter
    process needed)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    LLM = importlib.import_module(f"phases.{PHASE}").LLM  # noqa: N806
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        LLM("tiny-llama", device="cpu", attention_backend="triton")


def test_parts_put_the_kernel_beside_flash_attention():
    """The baseline is p07 on FlashAttention (only the kernel differs), built twice for the A/A
    control, then p07 on its Triton kernel and p06 on FlashAttention."""
    assert set(bench.CPU_PARTS) == {"kernel"} and callable(bench.GPU_PARTS["kernel"])
    for name in ("latency", "latency-8b", "concurrency", "concurrency-8b"):
        run = bench.GPU_PARTS[name][0]
        assert run[run.index("--engines") + 1].split(",")[:4] == [
            "p07 attention_backend=flash-attn", "p07#2 attention_backend=flash-attn", "p07 attention_backend=triton",
            "p06 attention_backend=flash-attn"]
    assert "hf-static" in bench.GPU_PARTS["latency"][0][-1]


@pytest.mark.gpu
def test_kernel_matches_the_reference_in_bf16_on_the_gpu():
    import torch
    kernel_bench = importlib.import_module(f"phases.{PHASE}.kernel_bench")
    torch.manual_seed(0)
    assert all(c["ok"] for c in kernel_bench.check("cuda", torch.bfloat16))
