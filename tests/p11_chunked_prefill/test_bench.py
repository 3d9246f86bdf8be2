"""The phase's bench set: long-mix over a sweep of token budgets, and the standard workloads,
each with the previous phase built twice (the A/A control). And ServedLLM, inherited: it gives
the offline engine's tokens and dies with its parent."""
import importlib

from common import long_mix
from common.bench import engine_name, parse_engine_options
from tests.suites.served import *  # noqa: F401,F403 - ServedLLM's tests and fixtures, collected here

PHASE = "p11_chunked_prefill"
bench = importlib.import_module(f"phases.{PHASE}.bench")
EngineConfig = importlib.import_module(f"phases.{PHASE}.config").EngineConfig


def engines_of(part) -> list[str]:
    """The engine specs of a part: a long-mix part's closure, or common.bench's argument lists."""
    if callable(part):
        return part.engines
    [run] = part
    return run[run.index("--engines") + 1].split(",")


def test_every_part_carries_the_aa_control_and_this_engine():
    for parts in (bench.GPU_PARTS, bench.CPU_PARTS):
        for name, part in parts.items():
            engines = engines_of(part)
            assert engines[:2] == ["p10", "p10#2"], name
            assert any(engine_name(e) == "p11" for e in engines), name


def test_long_mix_sweeps_the_budget_up_to_no_chunking():
    budgets = [parse_engine_options(",".join(e.split()[1:])).get("max_num_batched_tokens")
               for e in engines_of(bench.GPU_PARTS["long-mix"])]
    assert {512, 1024, 2048, 4096, 8192, 16384} <= set(budgets)
    assert 16384 > long_mix.MIXES["llama-1b", "full"].long_hi + long_mix.MIXES["llama-1b", "full"].streams
    assert set(bench.CPU_PARTS) == {"long-mix", "offline", "concurrency"}
    assert {"long-mix", "long-mix-8b", "long-mix-8b-b", "offline", "concurrency", "concurrency-8b"} == set(bench.GPU_PARTS)


def test_every_engine_spec_is_a_valid_config():
    """Budgets below the default max_num_seqs come with fewer seats (the config checks it)."""
    for parts in (bench.GPU_PARTS, bench.CPU_PARTS):
        for part in parts.values():
            for spec in engines_of(part):
                if engine_name(spec) == "p11":
                    EngineConfig(model="tiny-llama", device="cpu", **parse_engine_options(",".join(spec.split()[1:])))


def test_readme_long_mix_lines_are_generated():
    """The README's long-mix headline and table are what `python -m common.long_mix readme` writes now."""
    import re
    from pathlib import Path

    from common.results import read_records
    text = (Path(__file__).resolve().parents[2] / "phases" / PHASE / "README.md").read_text()
    records = read_records(PHASE)
    for name, body in (("headline", long_mix.headline(records, PHASE)), ("table", long_mix.results_table(records))):
        m = re.search(rf"<!-- long-mix:{name} -->\n(.*?)\n<!-- /long-mix:{name} -->", text, re.S)
        assert m and m.group(1) == body, f"README long-mix {name} is stale: run python -m common.long_mix readme {PHASE}"
