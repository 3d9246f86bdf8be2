"""Command line: generate or chat with this phase's engine.

  python -m phases.<phase> --chat                 # a chat; piped input: one turn per line
  python -m phases.<phase> --chat --prompt "What is the capital of France?"
  python -m phases.<phase> --tensor-parallel-size 2 --prompt "Once upon a time"   # starts rank 1 itself
  torchrun --nproc-per-node 2 -m phases.<phase> --tensor-parallel-size 2 --prompt "Once upon a time"
  python -m phases.<phase> --disaggregation pd --prompt "Once upon a time"   # prefilled in a second process
  python -m phases.<phase> --profile --preset llama-1b --batch 1,64 --steps 3
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from common.bench import parse_engine_options
from common.chat import CHAT_MAX_TOKENS, chat
from common.device import default_device
from common.results import RESULTS
from common.sampling import SamplingParams

from .config import EngineConfig
from .engine import LLM
from .profiler import PHASE, profile_decode

DEFAULT_PROMPT = "What is the capital of France?"
MAX_TOKENS = 128                    # one answer's default budget; a chat reply's is CHAT_MAX_TOKENS


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Generate text with this phase's engine.")
    p.add_argument("--model", "--preset", default=None, help="preset name or local HF directory (default: "
                   "smollm2-135m; with --profile llama-1b on a GPU, tiny-llama on a CPU)")
    p.add_argument("--prompt", default=None, help="one answer to this prompt (without --chat, "
                   f"the default is {DEFAULT_PROMPT!r})")
    p.add_argument("--chat", action="store_true", help="use the chat template; without --prompt, "
                   "chat turn by turn (from a pipe: one turn per line)")
    p.add_argument("--max-tokens", type=int, default=None, help=f"default {MAX_TOKENS}, in a chat {CHAT_MAX_TOKENS}")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--attention-backend", default="auto", help="torch, flash-attn, triton or auto (on a GPU "
                   "flash-attn when installed, else triton; on CPU torch)")
    p.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false",
                   help="run every step eagerly (the ablation: without this phase's idea)")
    p.add_argument("--tensor-parallel-size", "--tp", type=int, default=1, help="ranks that split the model, "
                   "one device each (under torchrun: its --nproc-per-node; else started here)")
    p.add_argument("--disaggregation", "--pd", nargs="?", const="pd", default=None,
                   help="pd: prefill in a second process (a second GPU if any), decode here")
    p.add_argument("--profile", action="store_true", help="profile decode steps instead of generating")
    p.add_argument("--batch", default="1,64", help="--profile: comma-separated batch sizes")
    p.add_argument("--steps", type=int, default=3, help="--profile: decode steps profiled (and traced)")
    p.add_argument("--timed-steps", type=int, default=10, help="--profile: decode steps timed without it (twice: plain, then with the stage clock)")
    p.add_argument("--scale", choices=["full", "small"], default=None,
                   help="--profile: request lengths, full (512 + 256) or small (default on a CPU)")
    p.add_argument("--engine-options", default="", help="key=value,... for the engine (EngineConfig's "
                   "fields), over the flags above")
    p.add_argument("--out", default=None, help=f"--profile: output folder (default results/{PHASE})")
    return p.parse_args(argv)


def profile(args) -> None:
    """--profile: summary records and traces under results/<phase>/, one line per batch size."""
    if args.tensor_parallel_size != 1:
        raise ValueError("--profile runs one in-process engine: drop --tensor-parallel-size")
    gpu = (args.device or default_device()).startswith("cuda")
    options = {"device": args.device, "dtype": args.dtype, "attention_backend": args.attention_backend,
               "cuda_graph": args.cuda_graph} | engine_options(args.engine_options)                # --engine-options win
    out = Path(args.out or RESULTS / PHASE)
    records = profile_decode(args.model or ("llama-1b" if gpu else "tiny-llama"), parse_batches(args.batch),
                             steps=args.steps, timed_steps=args.timed_steps, out_dir=out,
                             scale=args.scale or ("full" if gpu else "small"),
                             **{k: v for k, v in options.items() if v is not None})
    for rec in records:
        m = rec["metrics"]
        print(f"[profile] {rec['preset']} batch {rec['setting']['batch']} on {rec['device']}: "
              f"{m['wall_ms_per_step']:.2f} ms/step, floor {m['ideal_ms_per_step']:.3f} ms, "
              f"{m['syncs_per_step']:g} syncs/step; under the profiler {m['wall_ms_per_step_profiled']:.2f} "
              f"ms/step, GPU idle {m['gpu_idle_frac']:.0%} of it")
    print(f"[profile] wrote {len(records)} records and their traces to {out}")


def engine_options(text: str) -> dict:
    """--engine-options, for a run as for --profile: EngineConfig's fields, a typo refused by name."""
    options = parse_engine_options(text)
    known = {field.name for field in dataclasses.fields(EngineConfig)} - {"model"}    # --model sets that
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"--engine-options: no engine option {', '.join(unknown)}; "
                         f"the options are {', '.join(sorted(known))}")
    return options


def parse_batches(text: str) -> list[int]:
    try:
        return [int(b) for b in text.split(",")]
    except ValueError:
        raise ValueError(f"--batch takes comma-separated integers, got {text!r}") from None


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.profile:
        try:
            return profile(args)
        except ValueError as e:
            raise SystemExit(f"error: {e}")
        except KeyboardInterrupt:                 # Ctrl-C: one line, no traceback
            raise SystemExit("interrupted")
    chatting = args.chat and args.prompt is None          # turn by turn, every reply streamed
    if args.max_tokens is None:
        args.max_tokens = CHAT_MAX_TOKENS if chatting else MAX_TOKENS
    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                max_tokens=args.max_tokens, stop=args.stop, seed=args.seed)
        options = dict(device=args.device, dtype=args.dtype, tensor_parallel_size=args.tensor_parallel_size,
                       disaggregation=args.disaggregation, attention_backend=args.attention_backend, cuda_graph=args.cuda_graph) \
            | engine_options(args.engine_options)
        llm = LLM(args.model or "smollm2-135m", **options)
        if llm.tp is not None and not llm.tp.driver:     # torchrun started this rank: rank 0 asks
            return llm.follow()
        if chatting:
            return chat(llm, params)
        prompt = DEFAULT_PROMPT if args.prompt is None else args.prompt
        prompt = llm.tokenizer.chat_ids(prompt) if args.chat else prompt
        start = time.perf_counter()
        out = llm.generate(prompt, params)[0]
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    except KeyboardInterrupt:                 # Ctrl-C: one line, no traceback
        raise SystemExit("interrupted")
    elapsed = time.perf_counter() - start
    print(out.text)
    print(f"\n[{len(out.token_ids)} tokens in {elapsed:.2f} s, {len(out.token_ids) / elapsed:.1f} tok/s, "
          f"TTFT {1e3 * out.ttft:.0f} ms, finish: {out.finish_reason}]")


if __name__ == "__main__":
    main()
