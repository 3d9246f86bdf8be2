"""The command line (`make phase-NN run`): answers, and turns bad input into a one-line error."""
from __future__ import annotations

import io
import subprocess
import sys

import pytest

from tests.conftest import ROOT



def test_cli_generates_and_reports(capsys, cli):
    cli.main(["--model", "tiny-llama", "--prompt", "Hello there", "--max-tokens", "5", "--device", "cpu"])
    out = capsys.readouterr().out
    assert "[5 tokens in" in out and "finish: length" in out


@pytest.mark.cli_paths
def test_cli_chat_answers_on_the_real_model(capsys, cli):
    """--chat --prompt: the prompt goes through the chat template, and the real model answers.
    Marked cli_paths: `make test` runs it where main()'s paths change (tests/selection.py PARTS);
    the phase's engine on the real model is the correctness suite's, in every phase."""
    cli.main(["--chat", "--prompt", "What is the capital of France?", "--max-tokens", "20", "--device", "cpu"])
    assert "Paris" in capsys.readouterr().out


def test_cli_chat_without_prompt_takes_turns_from_piped_stdin(capsys, cli, monkeypatch):
    """`--chat` without --prompt is the chat of `make run`; piped, each line is a turn and stdout
    holds the replies only (common/chat.py has the full tests)."""
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello\n/reset\nHi again\n"))
    cli.main(["--model", "tiny-llama", "--chat", "--max-tokens", "3", "--device", "cpu"])
    captured = capsys.readouterr()
    assert captured.out.endswith("\n") and "tok/s" not in captured.out
    cut = "[cut at max_tokens=3: finish length]"          # both replies stop at 3 tokens: said on stderr
    assert captured.err.splitlines() == [cut, "[history cleared]", cut]


@pytest.mark.parametrize("args,message", [
    (["--model", "no-such-model"], "unknown model"),
    (["--model", "tiny-llama", "--max-tokens", "0"], "max_tokens"),
    (["--model", "tiny-llama", "--temperature", "-1"], "temperature"),
    (["--model", "tiny-llama", "--dtype", "int3"], "unknown dtype"),
])
def test_cli_bad_input_is_one_clear_line(args, message, cli):
    with pytest.raises(SystemExit, match=message):
        cli.main([*args, "--device", "cpu"])


def test_cli_ctrl_c_is_one_line_not_a_traceback(cli, monkeypatch):
    """An interrupt mid-generation ends the command with one line."""
    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli.LLM, "generate", interrupted)
    with pytest.raises(SystemExit, match="^interrupted$"):
        cli.main(["--model", "tiny-llama", "--prompt", "Hello", "--max-tokens", "5", "--device", "cpu"])


@pytest.mark.cli_paths
def test_cli_error_in_a_real_process_is_one_line_and_status_1(phase):
    """The one subprocess of the CLI suites: what a user sees from `python -m phases.<phase>` with
    bad input is one line on stderr (no warning, no traceback) and exit status 1. The other CLI
    tests call main(argv) in this process. Marked cli_paths: `make test` runs it where the CLI's
    imports, main() or its `__main__` block change, not where a flag is only added and handed to
    the engine (tests/selection.py MARKED, PARTS); `make test-all` in every phase."""
    run = subprocess.run([sys.executable, "-m", f"phases.{phase}", "--model", "tiny-llama", "--max-tokens", "0",
                          "--device", "cpu"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: max_tokens must be a positive integer"), run.stderr
