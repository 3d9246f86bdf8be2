"""p07_triton_decode: our Triton paged decode kernel, run on CPU in Triton's interpreter
(TRITON_INTERPRET=1 must be set before triton is first imported, so each check runs in a fresh
process): the float64 reference on awkward sizes with poisoned outputs, and the engine's tokens."""
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

PHASE = "p07_triton_decode"
ROOT = Path(__file__).resolve().parents[2]
bench = importlib.import_module(f"phases.{PHASE}.bench")


def interpreted(code: str, interpret: bool = True) -> str:
    """Run `code` in a fresh Python with Triton's interpreter on (or off); return its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(ROOT)}
    env |= {"TRITON_INTERPRET": "1"} if interpret else {}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_kernel_matches_the_reference_on_awkward_sizes():
    """Pages of 1, 5 and 16, GQA groups of 1 to 8, head dims 16 to 128, contexts ending mid-page,
    scattered tables, output poisoned with NaN: every element written, fp32 error under 1e-4."""
    out = interpreted(f"from phases.{PHASE} import kernel_bench as k\n"
                      "import torch; torch.manual_seed(0)\n"
                      "print(all(c['ok'] for c in k.check('cpu', torch.float32)))")
    assert out.strip().splitlines()[-1] == "True", out


def test_engine_with_the_kernel_gives_the_reference_tokens():
    """Greedy and seeded sampled requests of mixed lengths: the triton backend's tokens are the
    torch backend's (fp32), on a Llama and a Qwen2 shape."""
    out = interpreted(f"""
from phases.{PHASE} import LLM
from common.sampling import SamplingParams
from tests.reference import prompts_for
opts = dict(device="cpu", dtype="float32", block_size=4, cpu_kv_cache_bytes=1 << 20)
params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
          SamplingParams(temperature=0.8, top_p=0.9, max_tokens=16, seed=5, ignore_eos=True)]
for preset in ("tiny-llama", "tiny-qwen2"):
    prompts = prompts_for(preset)[:2]
    runs = [[o.token_ids for o in LLM(preset, attention_backend=b, **opts).generate(prompts, params)]
            for b in ("triton", "torch")]
    print(preset, runs[0] == runs[1])
""")
    assert out.split() == ["tiny-llama", "True", "tiny-qwen2", "True"], out


def test_triton_on_cpu_without_the_interpreter_is_a_clear_error():
    """In a fresh process without TRITON_INTERPRET (this one may have it on): a clear ValueError."""
    out = interpreted(f"""
from phases.{PHASE} import LLM
try:
    LLM("tiny-llama", device="cpu", attention_backend="triton")
except ValueError as e:
    print("TRITON_INTERPRET=1" in str(e))
""", interpret=False)
    assert out.split() == ["True"], out


def test_parts_put_the_kernel_beside_flash_attention():
    assert set(bench.CPU_PARTS) == {"kernel"} and callable(bench.GPU_PARTS["kernel"])
    for name in ("latency", "latency-8b", "concurrency", "concurrency-8b"):
        run = bench.GPU_PARTS[name][0]
        assert run[run.index("--engines") + 1].split(",")[:3] == [
            "p06 attention_backend=flash-attn", "p07 attention_backend=triton", "p07 attention_backend=flash-attn"]
    assert "hf-static" in bench.GPU_PARTS["latency"][0][-1]


@pytest.mark.gpu
def test_kernel_matches_the_reference_in_bf16_on_the_gpu():
    import torch
    kernel_bench = importlib.import_module(f"phases.{PHASE}.kernel_bench")
    torch.manual_seed(0)
    assert all(c["ok"] for c in kernel_bench.check("cuda", torch.bfloat16))
