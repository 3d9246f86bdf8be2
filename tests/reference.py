"""The fixed prompt sets and the HuggingFace greedy reference every phase is compared against.

Computed lazily and cached for the whole pytest session (functools.cache), so the phase suites
(tests/p01_.../, tests/p02_.../, ...) all compare their engines to the same ids without
recomputing them. conftest.py exposes these as fixtures.

The HF ids are also kept in a file under .pytest_cache/hf_reference/, named by a digest of
everything they depend on (the preset's config and weights file, the prompts, REF_NEW_TOKENS,
the torch and transformers versions, the common/ code that builds and runs the HF model), so a
later session on the same inputs reads them instead of running HF again. `make test-all` always
recomputes them (and rewrites the file).
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib
import json
import os
from functools import cache
from pathlib import Path

import torch
import transformers

from common.hf_reference import build_hf_model, hf_greedy
from common.loader import resolve

REF_NEW_TOKENS = 32                      # greedy tokens per prompt, EOS ignored
REF_PRESETS = ("smollm2-135m", "tiny-llama", "tiny-qwen2", "tiny-mla")
RANDOM_PROMPT_LENS = (9, 32, 32, 600)    # two equal lengths (padding-free batches), one > 512
CAPITAL_QUESTION = "What is the capital of France?"
REAL_POOL_BYTES = 96 << 20               # a test's SmolLM2 KV pool: 2,100 tokens at fp32 (see real_pool)

# Varied prose (five unrelated topics) for the long prompt: long-context attention is only
# tested if the text is not one token repeated.
LONG_TEXT = """\
The printing press changed Europe faster than any invention before it. Around 1440, Johannes \
Gutenberg combined movable metal type, an oil-based ink and a screw press adapted from wine \
making. Within fifty years, presses were running in more than two hundred cities, and the price \
of a book fell so far that merchants, students and craftsmen could own one. Pamphlets spread \
arguments about religion and politics in weeks instead of years, and scholars could finally \
compare identical copies of the same text, which made errors easier to find and correct.

Baking bread at home takes patience more than skill. Flour, water, salt and yeast are mixed into \
a shaggy dough, which is then kneaded until it stretches without tearing. During the first rise, \
the yeast eats sugars in the flour and releases carbon dioxide, which the gluten network traps \
as bubbles. After shaping, a second, shorter rise relaxes the dough before it goes into a very \
hot oven, where steam keeps the crust soft long enough for the loaf to expand.

The night train from Vienna to Venice leaves a little after nine. For the first hours the \
windows show nothing but the lights of small stations, each with a single guard standing under \
a lamp. Somewhere past Villach the track climbs into the mountains, and passengers who wake \
early see snow on the peaks turning pink while the valleys are still dark. By breakfast the \
train crosses the lagoon on a long causeway, and the smell of salt water fills the corridor.

Photosynthesis is the process by which plants, algae and some bacteria turn light into chemical \
energy. Chlorophyll absorbs red and blue light, and that energy splits water molecules, releasing \
oxygen as a by-product. The electrons freed in this step drive the production of ATP and NADPH, \
which the Calvin cycle then uses to fix carbon dioxide from the air into three-carbon sugars. \
Almost every food chain on Earth depends on this reaction, directly or indirectly.

A compiler translates a program written in one language into another, usually lower-level, \
language. The front end reads the source text, splits it into tokens, parses those tokens into a \
syntax tree and checks types. The middle end rewrites an intermediate representation to remove \
redundant work, for example by folding constants, inlining small functions and hoisting \
invariant computations out of loops. The back end finally chooses machine instructions, assigns \
registers and lays out the code in memory, trying to keep the processor's pipelines busy.

Summarize the five paragraphs above in one sentence each:"""


@cache
def tokenizer():
    return resolve("smollm2-135m").tokenizer


@cache
def real_prompts() -> tuple[tuple[int, ...], ...]:
    """The SmolLM2 prompt set as token ids: 2 chat, 2 plain, 1 non-ASCII, 1 long (> 512 tokens)."""
    tok = tokenizer()
    prompts = [
        tok.chat_ids(CAPITAL_QUESTION),
        tok.chat_ids("Explain in two sentences why the sky is blue.",
                     system="You are a concise science teacher."),
        tok.encode("The three most important inventions of the nineteenth century were"),
        tok.encode("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
        tok.encode("你好，世界！🚀 请用一句话介绍一下长城。The Great Wall of China is"),
        tok.encode(LONG_TEXT),
    ]
    assert len(prompts[-1]) > 512, len(prompts[-1])
    return tuple(tuple(p) for p in prompts)


@cache
def random_prompts(preset: str) -> tuple[tuple[int, ...], ...]:
    """Seeded random-id prompts for a random-weight preset (lengths RANDOM_PROMPT_LENS)."""
    vocab = resolve(preset).config.vocab_size
    gen = torch.Generator().manual_seed(1234)
    return tuple(tuple(torch.randint(0, vocab, (n,), generator=gen).tolist()) for n in RANDOM_PROMPT_LENS)


def real_pool(phase: str, preset: str = "smollm2-135m") -> dict:
    """The KV pool option of a test's CPU engine on the real model, where the phase has a pool (p02
    on): REAL_POOL_BYTES instead of the 512 MiB default. An engine zeroes its whole pool when built,
    and on a 1-thread CPU the first touch of 512 MiB takes ~2 s, for each of the ~50 SmolLM2
    engines a test run builds; the reference set needs ~900 tokens of the pool. Tiny presets' pools
    are small already (bounded by max_num_seqs x max_model_len)."""
    config = importlib.import_module(f"phases.{phase}.config").EngineConfig
    has_pool = "cpu_kv_cache_bytes" in {f.name for f in dataclasses.fields(config)}
    return {"cpu_kv_cache_bytes": REAL_POOL_BYTES} if has_pool and preset == "smollm2-135m" else {}


def prompts_for(preset: str) -> list[list[int]]:
    """The reference prompt set of a preset, as fresh lists (callers may mutate them)."""
    prompts = real_prompts() if preset == "smollm2-135m" else random_prompts(preset)
    return [list(p) for p in prompts]


ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".pytest_cache" / "hf_reference"
HF_CODE = ("hf_reference.py", "loader.py", "weights.py", "presets.py", "model_config.py", "smollm2.py")


def reference_key(preset: str) -> str:
    """A digest of what HF's greedy ids for `preset` depend on (see the module docstring)."""
    source = resolve(preset)
    weights = sorted(source.hf_dir.glob("*.safetensors")) if source.hf_dir else []
    inputs = {"preset": preset, "config": source.hf_config.to_json_string(), "seed": source.seed,
              "weights": [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in weights],
              "prompts": prompts_for(preset), "new_tokens": REF_NEW_TOKENS,
              "versions": [torch.__version__, transformers.__version__],
              "code": [hashlib.sha256((ROOT / "common" / f).read_bytes()).hexdigest() for f in HF_CODE]}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:32]


def _compute(preset: str) -> list[list[int]]:
    model = build_hf_model(resolve(preset), "cpu", torch.float32)
    out = hf_greedy(model, prompts_for(preset), REF_NEW_TOKENS)
    del model
    return out


@cache
def _hf_reference(preset: str, recompute: bool = False) -> tuple[tuple[int, ...], ...]:
    path = CACHE / f"{preset}-{reference_key(preset)}.json"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{preset}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)      # parallel pytest workers: one computes, the others read it
        if path.is_file() and not recompute:
            out = json.loads(path.read_text())
        else:
            out = _compute(preset)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")    # whole or absent, never half written
            tmp.write_text(json.dumps(out))
            tmp.replace(path)
    return tuple(tuple(ids) for ids in out)


def hf_reference(preset: str, recompute: bool = False) -> list[list[int]]:
    """HF greedy ids (fp32, CPU, REF_NEW_TOKENS new tokens, EOS ignored) for prompts_for(preset);
    computed once per session per preset, or read from the file an earlier session left on the
    same inputs unless `recompute`."""
    if preset not in REF_PRESETS:
        raise ValueError(f"no reference for {preset!r}; choose one of {REF_PRESETS}")
    return [list(ids) for ids in _hf_reference(preset, recompute)]
