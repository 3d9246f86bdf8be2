"""`make phase-NN serve`: the OpenAI-compatible server on this phase's engine.

  python -m phases.<phase>.serve --model smollm2-135m --host 127.0.0.1 --port 8000
  python -m phases.<phase>.serve --model llama-1b --engine-options attention_backend=triton,max_num_seqs=128
  python -m phases.<phase>.serve --disaggregation pd   # front end, decode instance, prefill instance

It binds 127.0.0.1 unless told otherwise: the server has no authentication.

If the engine process dies, the server does not linger as a zombie: at once /health answers 503,
/metrics drops the engine's gauges, requests in flight end with a 503 error (streams: an error
event, then [DONE]); a second later the server exits with status 1, so its supervisor (systemd,
Kubernetes) restarts it.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys

import uvicorn

from common.bench import parse_engine_options

from .async_engine import AsyncLLM
from .config import EngineConfig
from .server import MAX_BODY_BYTES, build_app

EXIT_AFTER_DEAD_S = 1.0    # time for the replies in flight to carry the engine's error out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Serve this phase's engine over OpenAI's HTTP API. If the engine "
                                "process dies, the server exits with status 1 (for its supervisor to restart it).")
    p.add_argument("--model", "--preset", default="smollm2-135m", help="preset name or local HF directory")
    p.add_argument("--served-model-name", default=None, help="the name clients pass as 'model' (default: --model)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 exposes it to the network)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--tensor-parallel-size", "--tp", type=int, default=None,
                   help="ranks that split the model, one device each (the engine process starts them)")
    p.add_argument("--disaggregation", "--pd", nargs="?", const="pd", default=None,
                   help="pd: the engine process decodes and starts a prefill instance (a second GPU if any)")
    p.add_argument("--engine-options", default="", help="key=value,... for the engine (e.g. max_num_seqs=64)")
    p.add_argument("--max-waiting", type=int, default=1024, help="requests queued beyond the running batch "
                   "before the server answers 503")
    p.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES)
    p.add_argument("--log-level", default="info", help="uvicorn's: info logs every request, warning does not")
    args = p.parse_args(argv)
    try:
        args.engine_options = parse_engine_options(args.engine_options)
    except ValueError as e:
        p.error(str(e))
    return args


def check_options(model: str, options: dict) -> None:
    """The engine's config, built here before its process starts: a bad option is one line on
    stderr and exit code 2 (a usage error), not a traceback from the engine process."""
    known = [f.name for f in dataclasses.fields(EngineConfig) if f.name != "model"]     # --model names the model
    unknown = sorted(set(options) - set(known))
    try:
        if unknown:
            raise ValueError(f"unknown engine option {', '.join(unknown)} (the engine takes: {', '.join(known)})")
        EngineConfig(model=model, **options)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def main(argv=None) -> None:
    args = parse_args(argv)
    flags = {"device": args.device, "dtype": args.dtype, "tensor_parallel_size": args.tensor_parallel_size,
             "disaggregation": args.disaggregation}
    options = {k: v for k, v in flags.items() if v is not None} \
        | args.engine_options
    check_options(args.model, options)
    try:
        engine = AsyncLLM(args.model, max_waiting=args.max_waiting, **options)
    except (ValueError, RuntimeError) as e:
        sys.exit(f"error: {e}")
    app = build_app(engine, args.served_model_name or args.model, args.max_body_bytes)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level))
    engine.on_dead = lambda: asyncio.get_running_loop().call_later(EXIT_AFTER_DEAD_S, setattr, server, "should_exit", True)
    try:
        server.run()
    except KeyboardInterrupt:      # Ctrl-C (or SIGINT from ServedLLM): uvicorn has already shut down
        pass
    finally:
        engine.shutdown()
    if engine.error:
        sys.exit(f"error: {engine.error}; exiting for a supervisor to restart the server")


if __name__ == "__main__":
    main()
