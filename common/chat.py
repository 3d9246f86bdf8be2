"""Chat: a multi-turn conversation with any phase's engine, each reply streamed as it is decoded.

`python -m phases.<phase> --chat` without --prompt (what `make run` runs) lands in chat(). One
implementation serves every phase, through what its engine already has:
- from phase 02 on, the step API: add_request(), then step() until the request finishes, reading
  the tokens so far off the running sequence after every step;
- phase 01's serial engine: the per-token callback of its generate().

Typed at a terminal it is an interactive chat (a prompt, a footer per reply, /reset, /exit,
Ctrl-C stops a reply). With standard input from a pipe or a file, every line is one user turn and
standard output gets the replies only, one per turn, so `echo "Tell me a joke" | make run` works.

Decoding is the command line's: `make run` passes the model card's sampling settings (the
Makefile's CHAT_SAMPLING), `--temperature 0` decodes greedily. A sampled reply gets a seed of
its own, the session's seed plus the reply's number: --seed S replays a session reply by reply,
and without it each session draws a fresh seed (the terminal's first line names it).
"""
from __future__ import annotations

import dataclasses
import inspect
import random
import sys
from typing import Callable, TextIO

from .detokenizer import ReplyText
from .output import Output
from .sampling import SEED_LIMIT, SamplingParams

PROMPT = ">>> "
CHAT_MAX_TOKENS = 512      # a reply's default budget: room for a normal answer to end by itself
HELP = "/reset clears the history, /exit or Ctrl-D ends the chat, Ctrl-C stops a reply"


def chat(engine, params: SamplingParams, stdin: TextIO | None = None, stdout: TextIO | None = None,
         stderr: TextIO | None = None) -> None:
    """Run a chat session on `engine` until /exit or the end of input."""
    check_streamable(engine)
    ChatSession(engine, params, stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr).run()


def check_streamable(engine) -> None:
    """Only an in-process engine can stream: the worker-process engines (ParallelLLM) return
    whole outputs from generate() and nothing in between. `engine` may be the class, so that the
    command line refuses before it builds anything (a ParallelLLM starts its workers first)."""
    generate = getattr(engine, "generate", None)
    serial = generate is not None and "on_token" in inspect.signature(generate).parameters
    if not (hasattr(engine, "add_request") or serial):
        name = engine.__name__ if isinstance(engine, type) else type(engine).__name__
        raise ValueError(f"the chat streams replies from an in-process engine, and {name} "
                         f"only returns whole ones; drop --parallel, or pass --prompt for one answer")


# --- the conversation ---------------------------------------------------------------------------

class Conversation:
    """The turns so far as chat messages, turned into the prompt of the next reply. A template
    with a default system prompt (SmolLM2's has one) renders it every time, so it always stays."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.turns: list[dict] = []          # user, assistant, user, assistant, ..., user

    def ask(self, text: str) -> None:
        self.turns.append({"role": "user", "content": text})

    def answer(self, text: str) -> None:
        self.turns.append({"role": "assistant", "content": text})

    def retract(self) -> None:
        """Take back the last user turn (its reply failed), so turns stay in pairs."""
        self.turns.pop()

    def reset(self) -> None:
        self.turns.clear()

    def prompt_ids(self, budget: int) -> tuple[list[int], int]:
        """Token ids of the whole conversation through the chat template, at most `budget` of them.

        A long chat outgrows the context: the oldest exchanges (a user turn and its reply) go first,
        the new question stays. Returns the ids and how many exchanges went.
        Raises ValueError when the new question alone does not fit."""
        kept = self.turns
        ids = self.tokenizer.messages_ids(kept)
        while len(ids) > budget and len(kept) > 1:
            kept = kept[2:]
            ids = self.tokenizer.messages_ids(kept)
        if len(ids) > budget:            # the history stays as it was
            raise ValueError(f"this message takes {len(ids)} tokens with the chat template, and the context "
                             f"leaves {budget} beside the reply; shorten it or lower --max-tokens")
        dropped, self.turns = (len(self.turns) - len(kept)) // 2, kept
        return ids, dropped


# --- streaming text -----------------------------------------------------------------------------

class TextStream:
    """Writes a reply's text as its tokens arrive, and in the end exactly the engine's final text
    (common/detokenizer.py ReplyText: whole characters only, stop strings never shown)."""

    def __init__(self, tokenizer, write: Callable[[str], None], stop: list[str]):
        self.reply = ReplyText(tokenizer, stop)
        self.write = write

    @property
    def num_tokens(self) -> int:
        return self.reply.num_tokens

    @property
    def text(self) -> str:
        return self.reply.text

    def update(self, ids: list[int]) -> None:
        """The reply's token ids so far."""
        self.write(self.reply.add(ids[self.num_tokens:]))

    def finish(self, final_text: str) -> None:
        self.write(self.reply.finish(final_text))


# --- one reply, from either kind of engine ------------------------------------------------------

def stream_reply(engine, prompt_ids: list[int], params: SamplingParams,
                 on_tokens: Callable[[list[int]], None]) -> Output:
    """Generate one reply, calling on_tokens(reply ids so far) as tokens arrive. An exception from
    on_tokens (Ctrl-C) stops the request and leaves the engine ready for the next one."""
    if hasattr(engine, "add_request"):
        return _stepped_reply(engine, prompt_ids, params, on_tokens)
    return _serial_reply(engine, prompt_ids, params, on_tokens)


def _stepped_reply(engine, prompt_ids, params, on_tokens) -> Output:
    """Step API: step() returns only the requests it finished, but the request's Sequence (in the
    scheduler's waiting queue right after add_request) grows output_ids by one token per step,
    so we read them between steps. On Ctrl-C, the engine's own undo path (the one generate()
    takes) drops the request and frees its KV blocks."""
    request_id = engine.add_request(prompt_ids, params)
    seq = next(s for s in engine.scheduler.waiting if s.seq_id == request_id)
    try:
        while engine.has_unfinished():
            finished = dict(engine.step())
            if request_id in finished:
                return finished[request_id]
            on_tokens(seq.output_ids)
    except BaseException:
        engine._abort([seq])
        raise
    raise RuntimeError(f"request {request_id} left the engine unfinished")


def _serial_reply(engine, prompt_ids, params, on_tokens) -> Output:
    """The serial engine has no step API; its generate() calls on_token after every token. Ctrl-C
    needs no clean-up: it builds its KV cache per request, so it is ready for the next one as is."""
    return engine.generate(prompt_ids, params, on_token=on_tokens)[0]


# --- decoding -------------------------------------------------------------------------------------

def session_seed(params: SamplingParams) -> int:
    """The seed of a session's first reply: --seed's, or a fresh one per session."""
    return params.seed if params.seed is not None else random.SystemRandom().randrange(2**32)


def reply_params(params: SamplingParams, seed: int, index: int) -> SamplingParams:
    """Reply `index`'s sampling: its own seed (seed + index), so it draws the same samples
    whatever the replies before it drew from the engine; greedy replies need none."""
    if params.greedy:
        return params
    return dataclasses.replace(params, seed=(seed + index) % SEED_LIMIT)


def describe(params: SamplingParams, seed: int) -> str:
    """The session's decoding, for the terminal's first line."""
    if params.greedy:
        return "Greedy decoding"
    filters = "".join(f", {name} {value:g}" for name, value, off in
                      (("top_p", params.top_p, 1.0), ("top_k", params.top_k, 0)) if value != off)
    return (f"Sampling at temperature {params.temperature:g}{filters}, seed {seed} + reply number "
            f"(--temperature 0: greedy)")


# --- the session --------------------------------------------------------------------------------

class ChatSession:
    """Reads user turns, streams replies. Interactive on a terminal; replies only from a pipe."""

    def __init__(self, engine, params: SamplingParams, stdin: TextIO, stdout: TextIO, stderr: TextIO):
        self.engine, self.params = engine, params
        self.stdin, self.stdout = stdin, stdout
        self.interactive = stdin.isatty()
        self.info = stdout if self.interactive else stderr     # notes never mix with piped replies
        self.conversation = Conversation(engine.tokenizer)
        self.seed, self.replies = session_seed(params), 0       # replies so far: the next one's number

    def run(self) -> None:
        if self.interactive:
            import readline  # noqa: F401 - line editing and history for input()
            self.note(f"Chat with {self.engine.config.model}. {describe(self.params, self.seed)}. {HELP}.")
        while (line := self.read_line()) is not None:
            command = line.strip()
            if command == "/exit":
                return
            if command == "/reset":
                self.conversation.reset()
                self.note("[history cleared]")
            elif command:
                self.turn(line)

    def read_line(self) -> str | None:
        """The next user line, or None at the end of input. Ctrl-C at the prompt does not end the
        session (it is easy to press once too often while stopping a reply); it says how to."""
        if not self.interactive:
            line = self.stdin.readline()
            return line.rstrip("\r\n") if line else None
        try:
            return input(PROMPT)                     # the terminal: sys.stdin, with line editing
        except EOFError:
            self.write("\n")
            return None
        except KeyboardInterrupt:
            self.write("\n")
            self.note(f"[{HELP}]")
            return ""

    def turn(self, text: str) -> None:
        """One user turn and its streamed reply, which joins the history (as far as it got)."""
        self.conversation.ask(text)
        try:
            prompt_ids, dropped = self.conversation.prompt_ids(self.engine.max_model_len - self.params.max_tokens)
        except ValueError as e:
            self.conversation.retract()
            return self.note(f"[{e}]")
        if dropped:
            self.note(f"[the conversation outgrew the context: dropped the oldest {dropped} exchange(s)]")
        self.reply(prompt_ids)

    def reply(self, prompt_ids: list[int]) -> None:
        """Stream the reply. Ctrl-C stops it; the part already shown stays in the history, since
        that is what the user saw (a reply stopped before any text takes its question with it)."""
        stream = TextStream(self.engine.tokenizer, self.write, self.params.stop)
        params, self.replies = reply_params(self.params, self.seed, self.replies), self.replies + 1
        try:
            out = stream_reply(self.engine, prompt_ids, params, stream.update)
            stream.finish(out.text)
        except KeyboardInterrupt:
            out = None
        except ValueError as e:          # the engine refused the request (e.g. its KV pool is too small)
            self.conversation.retract()
            return self.note(f"[{e}]")
        self.write("\n")
        if out is not None or stream.text:
            self.conversation.answer(stream.text)
        else:
            self.conversation.retract()
        if out is None:
            self.note(f"[stopped after {stream.num_tokens} tokens]")
        else:
            self.footer(out)

    def footer(self, out: Output) -> None:
        """At a terminal: the reply's numbers, and why it ended when max_tokens cut it mid-sentence
        (as --prompt's footer says "finish: length"). From a pipe, only the cut, on stderr: stdout
        holds replies only, and a reply that stops mid-sentence must not pass for a whole one."""
        cut = f"cut at max_tokens={self.params.max_tokens}: finish length" if out.finish_reason == "length" else ""
        if self.interactive and out.token_ids:
            n, elapsed = len(out.token_ids), out.token_times[-1] - out.arrival_time
            self.note(f"[{n} tokens in {elapsed:.2f} s, {n / elapsed:.1f} tok/s, TTFT {1e3 * out.ttft:.0f} ms"
                      f"{'; ' + cut if cut else ''}]")
        elif cut:
            self.note(f"[{cut}]")

    def write(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def note(self, text: str) -> None:
        self.stdout.flush()
        self.info.write(text + "\n")
        self.info.flush()
