"""`make phase-NN serve`: the OpenAI-compatible server on this phase's engine.

  python -m phases.<phase>.serve --model smollm2-135m --host 127.0.0.1 --port 8000
  python -m phases.<phase>.serve --model llama-1b --engine-options attention_backend=triton,max_num_seqs=128

It binds 127.0.0.1 unless told otherwise: the server has no authentication.
"""
from __future__ import annotations

import argparse
import sys

import uvicorn

from common.bench import parse_engine_options

from .async_engine import AsyncLLM
from .server import MAX_BODY_BYTES, build_app


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Serve this phase's engine over OpenAI's HTTP API.")
    p.add_argument("--model", "--preset", default="smollm2-135m", help="preset name or local HF directory")
    p.add_argument("--served-model-name", default=None, help="the name clients pass as 'model' (default: --model)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 exposes it to the network)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--engine-options", default="", help="key=value,... for the engine (e.g. max_num_seqs=64)")
    p.add_argument("--max-waiting", type=int, default=1024, help="requests queued beyond the running batch "
                   "before the server answers 503")
    p.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES)
    p.add_argument("--log-level", default="info", help="uvicorn's: info logs every request, warning does not")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    options = {k: v for k, v in {"device": args.device, "dtype": args.dtype}.items() if v is not None} \
        | parse_engine_options(args.engine_options)
    try:
        engine = AsyncLLM(args.model, max_waiting=args.max_waiting, **options)
    except (ValueError, RuntimeError) as e:
        sys.exit(f"error: {e}")
    app = build_app(engine, args.served_model_name or args.model, args.max_body_bytes)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
