"""Greedy parity: where bf16 greedy decoding parts from fp32, and which engine paths keep it equal.

"Same tokens" is a promise with a precise scope. In fp32 every path of every phase is tested equal
to HF's greedy tokens. In bf16 each matmul rounds to 8 bits of mantissa, and how it rounds depends
on the kernel and the shape it runs in: the same token's logits differ (slightly) between a step of
1 row and a step of 5, a prefill of the whole prompt and a prefill of the part after a cached
prefix. Greedy decoding keeps such a difference invisible until two candidates are within it (a
near-tie); from there the continuations part. This measures how often that happens and where,
on the real SmolLM2 (its logits have real near-ties; a random-weight model's do not mean much):

  bf16 vs fp32       the same engine, one prompt at a time, eager, cold cache
  batched            bf16, all prompts in one call, prefix caching off (other batch shapes) vs
                     bf16 one at a time
  prefix hit         bf16, one at a time, each prompt run again at once: it reads its cached
                     prefix (every full block but the last token's) instead of computing it, vs cold
  graphs             bf16, decode replayed from CUDA graphs vs eager (same kernels, same lanes)
  verify             bf16, n-gram speculation (k + 1 row verify steps) vs plain decode

Each record: per prompt the first position where the two sequences part (None: equal throughout),
how many prompts parted, and the median first position. `make phase-14 bench PART=parity`.
"""
from __future__ import annotations

import importlib
import statistics

import torch

from .loader import resolve
from .results import RESULTS, device_tag, provenance, write_records
from .sampling import SamplingParams

NEW_TOKENS = 128
QUESTIONS = (
    "What is the capital of France?", "Explain in two sentences why the sky is blue.",
    "Write a haiku about autumn leaves.", "What is the difference between a list and a tuple in Python?",
    "Give three tips for a good night's sleep.", "How does a refrigerator keep food cold?",
    "Summarize the plot of Romeo and Juliet in three sentences.", "What causes the seasons on Earth?",
    "Write a short poem about the sea.", "Explain recursion to a ten-year-old.",
    "What are the main ingredients of bread?", "Why do cats purr?",
    "Describe the water cycle.", "What is photosynthesis?", "How do vaccines work?",
    "List the planets of the solar system in order.",
)
TEXTS = (
    "The three most important inventions of the nineteenth century were",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the mountains, there lived",
    "The history of the Roman Empire can be divided into",
    "To make a cup of tea, first",
    "import numpy as np\n\ndef moving_average(x, window):\n",
    "The mitochondria is the powerhouse of the cell because",
    "In 1969, the first humans to walk on the Moon",
)
SYSTEM = "You are a helpful assistant. Answer carefully and completely."   # a shared prefix for the hit


def prompts(tokenizer) -> list[list[int]]:
    """24 prompts: 16 chat turns behind one system prompt (so a second call hits its blocks), 8 texts."""
    return [tokenizer.chat_ids(q, system=SYSTEM) for q in QUESTIONS] + [tokenizer.encode(t) for t in TEXTS]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token sequences differ, or None."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def one_by_one(llm, ids: list[list[int]], params: SamplingParams, again: bool = False) -> list[list[int]]:
    """Each prompt alone, the prefix cache emptied before each: no batch or cache effects.
    again: each prompt's second run, which reads the blocks its first one cached."""
    out = []
    for p in ids:
        llm.reset_prefix_cache()
        first = llm.generate([p], params)[0].token_ids
        out.append(llm.generate([p], params)[0].token_ids if again else first)
    return out


def compare(name: str, reference: list[list[int]], other: list[list[int]]) -> dict:
    firsts = [first_difference(a, b) for a, b in zip(reference, other)]
    parted = [f for f in firsts if f is not None]
    return {"comparison": name, "prompts": len(firsts), "parted": len(parted),
            "first_position_median": statistics.median(parted) if parted else None,
            "first_positions": firsts}


def measure(phase: str, device: str, num_prompts: int = 24, new_tokens: int = NEW_TOKENS,
            kv_cache_bytes: int = 1 << 30) -> list[dict]:
    LLM = importlib.import_module(f"phases.{phase}").LLM
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    common = dict(device=device, max_model_len=1024, max_num_seqs=32, kv_cache_bytes=kv_cache_bytes)
    ids = prompts(resolve("smollm2-135m").tokenizer)[:num_prompts]
    fp32 = one_by_one(LLM("smollm2-135m", dtype="float32", cuda_graph=False, **common), ids, params)
    eager = LLM("smollm2-135m", dtype="bfloat16", cuda_graph=False, **common)
    bf16 = one_by_one(eager, ids, params)
    rows = [compare("bf16 vs fp32", fp32, bf16),
            compare("prefix hit vs cold (bf16)", bf16, one_by_one(eager, ids, params, again=True))]
    del eager
    unshared = LLM("smollm2-135m", dtype="bfloat16", cuda_graph=False, enable_prefix_caching=False, **common)
    rows.append(compare("batched vs one at a time (bf16)", bf16, [o.token_ids for o in unshared.generate(ids, params)]))
    del unshared
    graphs = LLM("smollm2-135m", dtype="bfloat16", **common)
    rows.append(compare("graphs vs eager (bf16)", bf16, one_by_one(graphs, ids, params)))
    del graphs
    spec = LLM("smollm2-135m", dtype="bfloat16", cuda_graph=False, speculative="ngram", **common)
    rows.append(compare("ngram verify vs plain (bf16)", bf16, one_by_one(spec, ids, params)))
    return rows


def part(phase: str, small: bool = False):
    """The bench part: measure on this device and merge the records into results/<phase>/. small:
    4 prompts of 16 tokens, a small pool (the CPU's run: the plumbing, not the statistics)."""
    def run(rest: list[str], command: str) -> None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
        size = dict(num_prompts=4, new_tokens=16, kv_cache_bytes=96 << 20) if small else {}
        records = [{"phase": phase, "engine": phase[:3], "workload": "greedy-parity", "preset": "smollm2-135m",
                    "dtype": "bfloat16", "scale": "small" if small else "full",
                    "setting": {"comparison": row["comparison"]}, "device": name,
                    "metrics": {k: v for k, v in row.items() if k != "comparison"},
                    "provenance": provenance(name) | {"make_command": command}}
                   for row in measure(phase, device, **size)]
        write_records(RESULTS / phase / f"parity-{device_tag(name)}.json", records)
        print(f"{'comparison':36s} {'parted':>8s} {'first (median)':>15s}")
        for r in records:
            m = r["metrics"]
            print(f"{r['setting']['comparison']:36s} {m['parted']:>4d}/{m['prompts']:<3d} {str(m['first_position_median']):>15s}")
    return run
