"""Command line: generate or chat with this phase's engine.

  python -m phases.<phase> --chat                 # a chat; piped input: one turn per line
  python -m phases.<phase> --chat --prompt "What is the capital of France?"
"""
from __future__ import annotations

import argparse
import time

from common.chat import CHAT_MAX_TOKENS, chat, check_streamable
from common.sampling import SamplingParams

from .engine import LLM

DEFAULT_PROMPT = "What is the capital of France?"
MAX_TOKENS = 128                    # one answer's default budget; a chat reply's is CHAT_MAX_TOKENS


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Generate text with this phase's engine.")
    p.add_argument("--model", default="smollm2-135m", help="preset name or local HF directory")
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
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    chatting = args.chat and args.prompt is None          # turn by turn, every reply streamed
    if args.max_tokens is None:
        args.max_tokens = CHAT_MAX_TOKENS if chatting else MAX_TOKENS
    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                max_tokens=args.max_tokens, stop=args.stop, seed=args.seed)
        options = dict(device=args.device, dtype=args.dtype)
        engine = LLM
        if chatting:
            check_streamable(engine)        # refused before anything is built or started
        llm = engine(args.model, **options)
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
