"""The command line (`python -m phases.<phase>`), called in-process through main(argv): the chat's
default reply budget, flags that could not work together refused before anything is built or
started, and --engine-options honoured on a plain run, not only under --profile."""
import contextlib
import importlib
import io
import multiprocessing

import pytest

from common.chat import CHAT_MAX_TOKENS

TINY = ["--model", "tiny-llama", "--device", "cpu", "--dtype", "float32"]


@pytest.fixture(scope="module")
def cli(phase):
    return importlib.import_module(f"phases.{phase}.__main__")


def has_flag(cli, flag: str) -> bool:
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            cli.parse_args([flag, "none"])
        except SystemExit:
            return False
    return True


@pytest.fixture
def built(cli, monkeypatch):
    """Every engine main() builds, and the SamplingParams each chat gets (the chat itself is skipped)."""
    engines, chats = [], []

    class Recorded(cli.LLM):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            engines.append(self)
    monkeypatch.setattr(cli, "LLM", Recorded)
    monkeypatch.setattr(cli, "chat", lambda llm, params: chats.append(params))
    return engines, chats


def test_a_chat_reply_has_room_to_finish(cli, built):
    """A chat's default reply budget lets a normal answer end by itself; one answer keeps 128."""
    engines, chats = built
    cli.main([*TINY, "--chat"])
    assert chats[0].max_tokens == CHAT_MAX_TOKENS >= 512
    cli.main([*TINY, "--chat", "--max-tokens", "7"])
    assert chats[1].max_tokens == 7
    assert cli.parse_args([]).max_tokens is None and cli.MAX_TOKENS == 128


def test_chat_with_parallel_is_refused_before_any_worker_starts(cli, monkeypatch):
    if not has_flag(cli, "--parallel"):
        pytest.skip("no --parallel in this phase")
    router = importlib.import_module(cli.ParallelLLM.__module__)

    def no_workers(*args, **kwargs):
        raise AssertionError("workers started")
    monkeypatch.setattr(router, "WorkerPool", no_workers)
    before = set(multiprocessing.active_children())
    with pytest.raises(SystemExit, match="error: the chat streams .* ParallelLLM .*drop --parallel"):
        cli.main([*TINY, "--chat", "--parallel", "replica", "--world-size", "2"])
    assert set(multiprocessing.active_children()) == before


def test_engine_options_reach_the_engine_of_a_run(cli, built):
    if not has_flag(cli, "--engine-options"):
        pytest.skip("no --engine-options in this phase")
    engines, _ = built
    with contextlib.redirect_stdout(io.StringIO()):
        cli.main([*TINY, "--prompt", "hi", "--max-tokens", "2", "--engine-options", "block_size=4,max_num_seqs=3"])
    assert (engines[0].config.block_size, engines[0].config.max_num_seqs) == (4, 3)


def test_an_unknown_engine_option_is_refused_by_name(cli, built):
    if not has_flag(cli, "--engine-options"):
        pytest.skip("no --engine-options in this phase")
    with pytest.raises(SystemExit, match="error: --engine-options: no engine option blok_size; the options are"):
        cli.main([*TINY, "--prompt", "hi", "--engine-options", "blok_size=4"])
    assert not built[0]                         # refused before any engine was built
