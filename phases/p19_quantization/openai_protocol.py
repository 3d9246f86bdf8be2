"""OpenAI's request and response shapes for /v1/completions and /v1/chat/completions.

Requests are parsed by hand, not by a schema library, so every refusal names the parameter it is
about in OpenAI's error shape: {"error": {"message", "type", "param", "code"}} with status 400.
Unknown fields are ignored (clients send many); fields we cannot honour (logprobs, echo, best_of,
penalties) are refused instead of silently ignored. Extensions, as vLLM names them: top_k,
ignore_eos (generate exactly max_tokens), return_token_ids (each choice and chunk carries its ids),
priority (an integer, lower runs first: the engine's scheduling order, default 0).
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace

from common.sampling import SamplingParams, is_int

MAX_N = 16                     # choices per prompt


class APIError(Exception):
    """An error the client should see, in OpenAI's shape."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


@dataclass
class Parsed:
    model: str
    prompts: list                  # each a str, a list of token ids, or a list of chat messages
    params: SamplingParams
    n: int
    stream: bool
    include_usage: bool
    return_token_ids: bool
    priority: int
    default_max_tokens: bool       # the client sent none: capped later to the room its prompt leaves


SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "stop", "seed", "ignore_eos")
# Fields this engine cannot honour, with the values that ask for nothing (accepted).
REFUSED = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
           "suffix": (None, ""), "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
           "logit_bias": (None, {}), "tools": (None, [])}


def parse(body, chat: bool) -> Parsed:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' is required: a string naming the model (GET /v1/models lists it)", "model")
    for name, neutral in REFUSED.items():
        if name in body and body[name] not in neutral:
            raise bad(f"'{name}' is not supported by this server", name)
    prompts = [chat_messages(body.get("messages"))] if chat else completion_prompts(body.get("prompt"))
    for prompt in prompts:
        if isinstance(prompt, str):
            unicode_text(prompt, "prompt")
    n = body.get("n", 1)
    if not is_int(n) or not 1 <= n <= MAX_N:
        raise bad(f"'n' must be an integer from 1 to {MAX_N}, got {n!r}", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("'stream' must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad("'stream_options' must be an object", "stream_options")
    priority = body.get("priority", 0)
    if not is_int(priority):
        raise bad(f"'priority' must be an integer (lower runs first), got {priority!r}", "priority")
    no_max = body.get("max_tokens") is None and (not chat or body.get("max_completion_tokens") is None)
    return Parsed(model, prompts, sampling_params(body, chat), n, stream, bool(options.get("include_usage")),
                  bool(body.get("return_token_ids")), priority, no_max)


def completion_prompts(prompt) -> list:
    """A string, a list of token ids, or a list of either (a batch)."""
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt)):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(
            isinstance(p, str) or (isinstance(p, list) and p and all(is_int(t) for t in p)) for p in prompt):
        return prompt
    raise bad("'prompt' must be a non-empty string, a list of token ids, or a list of those", "prompt")


def chat_messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise bad(f"messages[{i}] must have a role of system, user or assistant", "messages")
        out.append({"role": m["role"], "content": message_text(m.get("content"), i)})
    return out


def message_text(content, i: int) -> str:
    """A message's content: a string, or a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return unicode_text(content, "messages")
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return unicode_text("".join(p["text"] for p in content), "messages")
    raise bad(f"messages[{i}].content must be a string or a list of text parts", "messages")


def unicode_text(text: str, param: str) -> str:
    """JSON can spell a lone surrogate ("\\ud800"), which is no Unicode text: the tokenizer would fail."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad(f"'{param}' is not valid Unicode text: {e}", param)
    return text


def sampling_params(body: dict, chat: bool) -> SamplingParams:
    """OpenAI defaults: temperature 1, top_p 1, max_tokens 16 for completions (chat: up to the
    context, capped here at 512 so a forgotten max_tokens cannot hold a slot for minutes). A
    default max_tokens is later capped to the room the prompt leaves (for_choice)."""
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) if chat else body.get("max_tokens")
    values = {"temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
              "top_k": body.get("top_k", 0), "stop": body.get("stop") or [], "seed": body.get("seed"),
              "ignore_eos": body.get("ignore_eos", False),
              "max_tokens": (512 if chat else 16) if max_tokens is None else max_tokens}
    for name in ("temperature", "top_p", "top_k"):
        if values[name] is None:
            values[name] = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}[name]
    try:
        return SamplingParams(**values)
    except (ValueError, TypeError) as e:       # SamplingParams names the field first in its message
        word = str(e).split()[0]
        raise bad(str(e), word if word in SAMPLING_FIELDS else None)


def for_choice(p: Parsed, i: int, room: int) -> SamplingParams:
    """Choice i of n: its own seed (seed + i), so n seeded samples differ but are reproducible. A
    default max_tokens is capped to `room`, the tokens its prompt leaves in the context: a long
    prompt must not be refused for a limit the client never asked for."""
    changes = {"seed": (p.params.seed + i) % 2**64} if p.params.seed is not None and i else {}
    if p.default_max_tokens and room > 0:
        changes["max_tokens"] = min(p.params.max_tokens, room)
    return replace(p.params, **changes)


def finish_reason(reason: str) -> str:
    return "length" if reason == "length" else "stop"


# --- responses ----------------------------------------------------------------------------------
def new_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage; prompt_tokens_details.cached_tokens: prompt tokens read from the prefix cache."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def response(rid: str, model: str, chat: bool, choices: list[tuple], use: dict, token_ids: bool) -> dict:
    """choices: (index, text, finish_reason, token ids)."""
    if chat:
        rows = [{"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason(r),
                 "logprobs": None} for i, text, r, _ in choices]
    else:
        rows = [{"index": i, "text": text, "finish_reason": finish_reason(r), "logprobs": None} for i, text, r, _ in choices]
    if token_ids:
        for row, (_, _, _, ids) in zip(rows, choices):
            row["token_ids"] = ids
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": rows, "usage": use}


def chunk(rid: str, model: str, chat: bool, index: int, text: str | None, reason: str | None,
          first: bool = False, token_ids: list[int] | None = None) -> dict:
    """One streamed piece of choice `index`. Chat's first chunk of a choice also names the role."""
    if chat:
        delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text is not None else {})
        row = {"index": index, "delta": delta, "finish_reason": reason and finish_reason(reason), "logprobs": None}
    else:
        row = {"index": index, "text": text or "", "finish_reason": reason and finish_reason(reason), "logprobs": None}
    if token_ids is not None:
        row["token_ids"] = token_ids
    return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [row]}


def usage_chunk(rid: str, model: str, chat: bool, use: dict) -> dict:
    return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [], "usage": use}
