"""common/chat.py, the chat behind `make run`: on the real SmolLM2 (fp32, CPU), through the serial
engine (phase 01, which streams from its decode loop) and a step-API engine (phase 08)."""
from __future__ import annotations

import builtins
import importlib
import io
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from common import chat as chat_module
from common.chat import TextStream, chat, check_streamable, reply_params, stream_reply
from common.sampling import SEED_LIMIT, SamplingParams
from tests.reference import real_pool

ROOT = Path(__file__).resolve().parents[2]
PARAMS = SamplingParams(temperature=0, max_tokens=16)
FRANCE, GERMANY = "What is the capital of France?", "And of Germany?"
CHINESE = "请用中文回答：你好吗？"       # greedy reply: Chinese, then emoji, cut mid-character at 16 tokens


@pytest.fixture(scope="module", params=["p01_serial_decode", "p08_preemption"])
def engine(request):
    return importlib.import_module(f"phases.{request.param}").LLM("smollm2-135m", device="cpu",
                                                                  **real_pool(request.param))


def piped_chat(engine, lines: list[str], stdout=None) -> tuple[str, str]:
    """Run a chat whose standard input is a pipe holding these lines; return (stdout, stderr)."""
    stdout, stderr = stdout or io.StringIO(), io.StringIO()
    chat(engine, PARAMS, io.StringIO("".join(line + "\n" for line in lines)), stdout, stderr)
    return stdout.getvalue(), stderr.getvalue()


def generate_reply(engine, messages: list[tuple[str, str]]) -> str:
    """What generate() answers to this conversation, templated the same way."""
    return generate_output(engine, messages).text


def generate_output(engine, messages: list[tuple[str, str]]):
    """generate()'s greedy output for this conversation: computed once per phase (and context
    length, which a test may lower), as the same turns recur across the tests."""
    key = (type(engine).__module__, engine.max_model_len, tuple(messages))
    if key not in GREEDY_OUTPUTS:
        ids = engine.tokenizer.messages_ids([{"role": r, "content": c} for r, c in messages])
        GREEDY_OUTPUTS[key] = engine.generate(ids, PARAMS)[0]
    return GREEDY_OUTPUTS[key]


GREEDY_OUTPUTS: dict = {}



def test_piped_session_gives_generates_replies(engine):
    """Each line is a turn, /reset forgets, and stdout holds the replies only, one per line."""
    out, err = piped_chat(engine, [FRANCE, GERMANY, "/reset", CHINESE])
    first = generate_reply(engine, [("user", FRANCE)])
    second = generate_reply(engine, [("user", FRANCE), ("assistant", first), ("user", GERMANY)])
    third = generate_reply(engine, [("user", CHINESE)])
    assert "Paris" in first and "Berlin" in second
    assert out == f"{first}\n{second}\n{third}\n"
    assert err == f"[history cleared]\n[cut at max_tokens={PARAMS.max_tokens}: finish length]\n"   # the third was cut


@pytest.mark.parametrize("prompt,stop", [(CHINESE, []), (FRANCE, ["Paris"])])
def test_streamed_text_is_the_final_text(engine, prompt, stop):
    """Pieces never hold half a character (or the start of a stop string), and they add up to
    Output.text exactly, also when the last token leaves a character unfinished."""
    params = SamplingParams(temperature=0, max_tokens=16, stop=stop)
    pieces = []
    stream = TextStream(engine.tokenizer, pieces.append, stop)
    out = stream_reply(engine, engine.tokenizer.chat_ids(prompt), params, stream.update)
    streamed = len(pieces)
    stream.finish(out.text)
    assert "".join(pieces) == out.text and streamed > 1
    assert not any("\ufffd" in p or "Paris" in p for p in pieces[:streamed])
    if not stop:   # the reply really splits characters over tokens
        assert any("\u4e00" <= ch <= "\u9fff" for ch in out.text)
        assert any(engine.tokenizer.decode(out.token_ids[:k]).endswith("\ufffd") for k in range(len(out.token_ids)))


class CtrlCOnce(io.StringIO):
    """A terminal whose user presses Ctrl-C while the at-th piece of text is written."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.writes = at, 0

    def write(self, text: str) -> int:
        self.writes += 1
        if self.writes == self.at:
            raise KeyboardInterrupt
        return super().write(text)


def test_ctrl_c_stops_the_reply_and_keeps_the_session(engine):
    """The stopped reply keeps what was shown, the engine is idle again, the next turn is answered."""
    out, err = piped_chat(engine, [FRANCE, GERMANY], stdout=CtrlCOnce(at=3))
    partial = out.split("\n")[0]
    assert partial and partial in generate_reply(engine, [("user", FRANCE)])
    second = generate_reply(engine, [("user", FRANCE), ("assistant", partial), ("user", GERMANY)])
    assert out == f"{partial}\n{second}\n"
    assert err == "[stopped after 3 tokens]\n"
    if hasattr(engine, "scheduler"):   # the stopped request gave its KV blocks back
        assert not engine.has_unfinished()
        assert engine.scheduler.block_manager.num_free_blocks == engine.cache.num_blocks


def test_history_longer_than_the_context_drops_the_oldest_turns(engine, monkeypatch):
    """A too-long message is refused with a note; a too-long history loses its oldest exchange."""
    alone = len(engine.tokenizer.messages_ids([{"role": "user", "content": GERMANY}]))
    monkeypatch.setattr(engine, "max_model_len", alone + PARAMS.max_tokens + 8)
    out, err = piped_chat(engine, [FRANCE, "word " * 200, GERMANY])
    assert out == f"{generate_reply(engine, [('user', FRANCE)])}\n{generate_reply(engine, [('user', GERMANY)])}\n"
    refused, dropped = [line for line in err.splitlines() if not line.startswith("[cut at max_tokens")]
    assert refused.startswith("[this message takes") and "shorten it or lower --max-tokens" in refused
    assert dropped == "[the conversation outgrew the context: dropped the oldest 1 exchange(s)]"


def test_exit_ends_the_session(engine):
    assert piped_chat(engine, ["/exit", FRANCE]) == ("", "")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_session_shows_prompt_footer_and_survives_ctrl_c_at_the_prompt(engine, monkeypatch):
    typed = iter([FRANCE, KeyboardInterrupt, EOFError])

    def fake_input(prompt: str) -> str:
        answer = next(typed)
        if isinstance(answer, type):
            raise answer
        return answer
    monkeypatch.setattr(builtins, "input", fake_input)
    stdout = io.StringIO()
    chat(engine, PARAMS, Terminal(), stdout, io.StringIO())
    lines = stdout.getvalue().splitlines()
    assert lines[0].startswith("Chat with smollm2-135m.") and "/reset" in lines[0]
    assert lines[1] == generate_reply(engine, [("user", FRANCE)])
    assert lines[2].startswith("[") and "tok/s, TTFT" in lines[2]
    assert "Ctrl-C stops a reply" in lines[4]          # after Ctrl-C at the prompt; then Ctrl-D ends


def test_a_cut_reply_says_so_in_its_footer(engine, monkeypatch):
    """A reply cut by max_tokens ends mid-sentence: its footer says so, as --prompt's footer says
    "finish: length"; a reply that ended by itself does not."""
    assert generate_output(engine, [("user", CHINESE)]).finish_reason == "length"
    assert generate_output(engine, [("user", FRANCE)]).finish_reason == "stop"
    typed = iter([CHINESE, "/reset", FRANCE])

    def fake_input(prompt: str) -> str:
        answer = next(typed, None)
        if answer is None:
            raise EOFError
        return answer
    monkeypatch.setattr(builtins, "input", fake_input)
    stdout = io.StringIO()
    chat(engine, PARAMS, Terminal(), stdout, io.StringIO())
    footers = [line for line in stdout.getvalue().splitlines() if "tok/s, TTFT" in line]
    assert footers[0].endswith(f" ms; cut at max_tokens={PARAMS.max_tokens}: finish length]")
    assert footers[1].endswith(" ms]")


def test_engine_without_step_api_is_refused_clearly():
    with pytest.raises(ValueError, match="drop --parallel, or pass --prompt"):
        check_streamable(object())


def test_an_engine_class_is_checked_before_it_is_built():
    """The command line checks the class, so a ParallelLLM is refused before its workers start."""
    parallel = importlib.import_module("phases.p04_replica_pipeline").ParallelLLM
    with pytest.raises(ValueError, match="and ParallelLLM only returns whole ones"):
        check_streamable(parallel)
    for phase in ("p01_serial_decode", "p08_preemption"):
        check_streamable(importlib.import_module(f"phases.{phase}").LLM)


def test_piped_command_line_answers_and_exits_0_at_eof():
    """`echo ... | python -m phases.<phase> --chat`: the reply on stdout, nothing else, exit code 0."""
    env = os.environ | {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "phases.p08_preemption", "--chat", "--max-tokens", "16",
                           "--device", "cpu"], input=FRANCE + "\n", capture_output=True, text=True,
                          encoding="utf-8", env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Paris" in done.stdout and done.stdout.count("\n") == 1


# --- decoding: `make run` samples with the model card's settings, one seed per reply ----------------

def make_run_argv(*make_args: str) -> list[str]:
    """The phase's arguments in the command `make run` would run (make -n prints it). Without the
    calling make's ARGS: `make test ARGS=...` exports it, and `make run` would take it as its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "ARGS")}
    printed = subprocess.run(["make", "-n", "--no-print-directory", "run", *make_args], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=True).stdout
    line = next(line for line in printed.splitlines() if " -m phases." in line and "--chat" in line)
    argv = shlex.split(line)
    return argv[argv.index("-m") + 2:]


def test_make_run_samples_with_the_model_cards_settings_and_greedy_is_one_flag_away():
    """SmolLM2-135M-Instruct's card samples at temperature 0.2, top_p 0.9 (the Makefile's
    CHAT_SAMPLING); ARGS="--temperature 0" is greedy again. Every phase's CLI takes both flags."""
    cli = importlib.import_module("phases.p14_cuda_graphs.__main__")
    args = cli.parse_args(make_run_argv())
    assert args.chat and (args.temperature, args.top_p, args.top_k, args.seed) == (0.2, 0.9, 0, None)
    greedy = cli.parse_args(make_run_argv("ARGS=--temperature 0 --seed 3"))
    assert (greedy.temperature, greedy.seed) == (0.0, 3)
    for phase in sorted(p.name for p in (ROOT / "phases").glob("p[0-9][0-9]_*")):
        parsed = importlib.import_module(f"phases.{phase}.__main__").parse_args(make_run_argv())
        assert (parsed.temperature, parsed.top_p) == (0.2, 0.9), phase


def test_each_sampled_reply_has_a_seed_of_its_own():
    """Reply i samples with seed + i (so it draws what it would draw alone, whatever the replies
    before it drew); --seed replays a session; without one each session draws a fresh seed;
    greedy replies are left as they are."""
    params = SamplingParams(temperature=0.2, top_p=0.9, max_tokens=8)
    assert [reply_params(params, 5, i).seed for i in range(3)] == [5, 6, 7]
    assert reply_params(params, SEED_LIMIT - 1, 1).seed == 0
    assert reply_params(PARAMS, 5, 1) is PARAMS
    assert chat_module.session_seed(SamplingParams(temperature=0.2, seed=11)) == 11
    assert len({chat_module.session_seed(params) for _ in range(4)}) > 1


def test_a_sampled_session_is_generate_with_one_seed_per_reply(engine):
    """Piped, two turns at temperature 1 with --seed 7: the replies are generate()'s with seeds 7
    and 8, and the same session run again gives the same replies."""
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, seed=7)
    stdout, stderr = io.StringIO(), io.StringIO()
    chat(engine, params, io.StringIO(f"{FRANCE}\n{GERMANY}\n"), stdout, stderr)
    first, second = stdout.getvalue().split("\n")[:2]

    def reply(messages, seed):
        ids = engine.tokenizer.messages_ids([{"role": r, "content": c} for r, c in messages])
        return engine.generate(ids, SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, seed=seed))[0].text
    assert first == reply([("user", FRANCE)], 7)
    assert second == reply([("user", FRANCE), ("assistant", first), ("user", GERMANY)], 8)
    again = io.StringIO()
    chat(engine, params, io.StringIO(f"{FRANCE}\n{GERMANY}\n"), again, io.StringIO())
    assert again.getvalue() == stdout.getvalue()


def test_the_terminal_names_the_decoding(engine, monkeypatch):
    """The first line says how replies are decoded: the sampling settings and the session's seed,
    or greedy."""
    monkeypatch.setattr(builtins, "input", lambda prompt: (_ for _ in ()).throw(EOFError))
    lines = {}
    for name, params in (("sampled", SamplingParams(temperature=0.2, top_p=0.9, max_tokens=8, seed=42)),
                         ("greedy", PARAMS)):
        stdout = io.StringIO()
        chat(engine, params, Terminal(), stdout, io.StringIO())
        lines[name] = stdout.getvalue().splitlines()[0]
    assert "Sampling at temperature 0.2, top_p 0.9, seed 42 + reply number (--temperature 0: greedy)" in lines["sampled"]
    assert lines["greedy"].startswith("Chat with smollm2-135m. Greedy decoding.")

