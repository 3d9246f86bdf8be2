"""A local checkpoint directory that is broken fails at load time with one clear error naming the
file (and the tensor), never loads garbage: the shape check in common/weights.py, the config
check in common/loader.py, and the CLI that turns either into one line and a nonzero exit."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from common.loader import resolve
from common.sampling import SamplingParams
from common.weights import ours_to_hf, random_weights

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
    """tiny-llama's seeded random weights saved as an HF directory (config.json + safetensors)."""
    folder = tmp_path_factory.mktemp("tiny-llama-hf")
    source = resolve("tiny-llama")
    weights = ours_to_hf(random_weights(source.config, 0, "cpu", torch.float32))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    source.hf_config.to_json_file(str(folder / "config.json"))
    return folder


@pytest.fixture
def broken(good_dir, tmp_path):
    """broken(edit_tensors=None, config_text=None, truncate=None): a copy of good_dir, damaged."""
    def make(edit_tensors=None, config_text=None, truncate=None):
        folder = tmp_path / "model"
        shutil.copytree(good_dir, folder)
        file = folder / "model.safetensors"
        if edit_tensors:
            tensors = load_file(str(file))
            edit_tensors(tensors)
            save_file(tensors, str(file))
        if config_text is not None:
            (folder / "config.json").write_text(config_text)
        if truncate is not None:
            file.write_bytes(file.read_bytes()[:truncate])
        return folder
    return make


def test_good_directory_matches_preset(LLM, good_dir):
    """The undamaged copy loads and generates what the preset itself does (ids only: the
    directory holds no tokenizer)."""
    ids = LLM(str(good_dir), device="cpu", dtype="float32", detokenize=False).generate([PROMPT], GREEDY)[0].token_ids
    assert ids == LLM("tiny-llama", device="cpu", dtype="float32").generate([PROMPT], GREEDY)[0].token_ids


def _shrink(name, shape):
    def edit(tensors):
        tensors[name] = tensors[name].flatten()[:shape[0] * (shape[1] if len(shape) > 1 else 1)].reshape(shape).clone()
    return edit


def _drop(name):
    return lambda tensors: tensors.pop(name)


def _add(name, shape):
    return lambda tensors: tensors.__setitem__(name, torch.zeros(shape))


@pytest.mark.parametrize("edit, message", [
    (_shrink("model.norm.weight", (1,)),                     # copy_ would broadcast it silently
     r"model.safetensors: tensor 'model.norm.weight' has shape \[1\], the model needs \[64\]"),
    (_shrink("lm_head.weight", (1, 64)),                      # so would a one-row head
     r"model.safetensors: tensor 'lm_head.weight' has shape \[1, 64\], the model needs \[49152, 64\]"),
    (_drop("model.layers.1.mlp.up_proj.weight"),              # was a bare KeyError
     r"lacks 1 tensor\(s\) the model needs, e.g. 'model.layers.1.mlp.up_proj.weight'"),
    (_add("model.layers.0.self_attn.q_proj.bias", (64,)),     # a bias the config does not have
     r"model.safetensors: tensor 'model.layers.0.self_attn.q_proj.bias' is not part of this model"),
])
def test_bad_tensor_is_named(LLM, broken, edit, message):
    with pytest.raises(ValueError, match=message):
        LLM(str(broken(edit_tensors=edit)), device="cpu", dtype="float32")


def test_truncated_safetensors(LLM, broken):
    folder = broken(truncate=100_000)
    with pytest.raises(ValueError, match="model.safetensors: not a readable safetensors file"):
        LLM(str(folder), device="cpu", dtype="float32")


@pytest.mark.parametrize("text, message", [
    ("{not json", "config.json: not a valid model config"),
    ('{"model_type": "no-such-arch"}', "config.json: not a valid model config"),
    (json.dumps({"model_type": "llama", "hidden_size": -64}), "config.json: not a usable model config "
     r"\(hidden_size must be a positive integer"),
])
def test_bad_config(LLM, broken, text, message):
    with pytest.raises(ValueError, match=message):
        LLM(str(broken(config_text=text)), device="cpu", dtype="float32")


@pytest.mark.parametrize("damage", [dict(truncate=100_000), dict(config_text="{not json")])
def test_cli_prints_one_line(cli, broken, damage, capfd):
    """python -m phases.<phase> --model DIR: one line naming the file, exit status 1. In process,
    through the CLI's main(argv): SystemExit with a one-line message is that line on stderr and
    exit status 1; a real process's stderr and exit status are checked once per CLI change by
    tests/suites/cli.py (test_cli_error_in_a_real_process_is_one_line_and_status_1)."""
    folder = broken(**damage)
    with pytest.raises(SystemExit) as exited:
        cli.main(["--model", str(folder), "--device", "cpu", "--max-tokens", "2"])
    message = str(exited.value.code)
    assert len(message.splitlines()) == 1 and message.startswith(f"error: {folder}"), message
    assert capfd.readouterr().err == ""
