"""The phase's bench set: every comparison part carries p13 twice (the A/A control) and p14 on both
GPU backends where both apply; the peer's parts run nano-vllm on both models. And ServedLLM,
inherited: it gives the offline engine's tokens and dies with its parent."""
import importlib

from common.bench import engine_name, parse_engine_options
from tests.suites.served import *  # noqa: F401,F403 - ServedLLM's tests and fixtures, collected here

PHASE = "p14_cuda_graphs"
bench = importlib.import_module(f"phases.{PHASE}.bench")
EngineConfig = importlib.import_module(f"phases.{PHASE}.config").EngineConfig


def engines_of(part) -> list[str]:
    [run] = part
    return run[run.index("--engines") + 1].split(",")


def comparisons():
    for parts in (bench.GPU_PARTS, bench.CPU_PARTS):
        for name, part in parts.items():
            if not callable(part):
                yield name, part


def test_every_comparison_carries_the_aa_control_and_this_engine():
    for name, part in comparisons():
        engines = engines_of(part)
        assert engines[:2] == ["p13", "p13#2"], name
        assert any(engine_name(e) == "p14" for e in engines), name


def test_the_goals_workloads_on_both_models_and_the_peer_beside_them():
    gpu = bench.GPU_PARTS
    assert {"latency", "latency-8b", "concurrency", "concurrency-8b", "offline", "offline-8b"} <= set(gpu)
    assert gpu["nano-vllm"].preset == "llama-1b" and gpu["nano-vllm-8b"].preset == "llama-8b"
    assert "p14 attention_backend=triton" in engines_of(gpu["latency"])      # our kernel inside the graphs too


def test_every_engine_spec_is_a_valid_config():
    """(The backend is checked where it runs: triton needs a GPU or the interpreter.)"""
    for _, part in comparisons():
        for spec in engines_of(part):
            if engine_name(spec) == "p14":
                options = parse_engine_options(",".join(spec.split()[1:]))
                options.pop("attention_backend", None)
                EngineConfig(model="tiny-llama", device="cpu", **options)
