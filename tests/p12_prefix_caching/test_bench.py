"""The phase's bench set: shared-prefix with its no-sharing control, multi-turn, the chat, and
the standard workloads, each with the previous phase built twice (the A/A control); the
workload generator's requests and its ideal hit rate. And ServedLLM, inherited: it gives the
offline engine's tokens and dies with its parent."""
import importlib
import re
from pathlib import Path
from types import SimpleNamespace

from common import shared_prefix
from common.bench import engine_name, parse_engine_options
from common.results import read_records
from tests.suites.served import *  # noqa: F401,F403 - ServedLLM's tests and fixtures, collected here

PHASE = "p12_prefix_caching"
bench = importlib.import_module(f"phases.{PHASE}.bench")
EngineConfig = importlib.import_module(f"phases.{PHASE}.config").EngineConfig


def engines_of(part) -> list[str]:
    """The engine specs of a part: a shared-prefix part's closure, or common.bench's argument lists."""
    if callable(part):
        return part.engines
    [run] = part
    return run[run.index("--engines") + 1].split(",")


def test_every_part_carries_the_aa_control_and_this_engine():
    for parts in (bench.GPU_PARTS, bench.CPU_PARTS):
        for name, part in parts.items():
            engines = engines_of(part)
            assert engines[:2] == ["p11", "p11#2"], name
            assert "p12" in engines, name


def test_the_parts_measure_the_goals_workloads():
    """shared-prefix with its control on llama-1b and llama-8b, multi-turn, the cache-off
    ablation beside the 1b run; on the CPU the same at small scale, and the chat on SmolLM2."""
    gpu, cpu = bench.GPU_PARTS, bench.CPU_PARTS
    assert (gpu["shared-prefix"].preset, gpu["shared-prefix-8b"].preset, gpu["no-sharing-8b"].preset) == \
        ("llama-1b", "llama-8b", "llama-8b")
    for part in (gpu["shared-prefix"], cpu["shared-prefix"]):
        assert part.workloads == ["shared-prefix", "no-sharing"]
    assert gpu["shared-prefix-8b"].workloads + gpu["no-sharing-8b"].workloads == ["shared-prefix", "no-sharing"]
    assert gpu["multi-turn"].workloads == ["multi-turn"] and cpu["chat"].preset == "smollm2-135m"
    assert "p12 enable_prefix_caching=0" in gpu["shared-prefix"].engines and "p12 enable_prefix_caching=0" in cpu["shared-prefix"].engines


def test_every_engine_spec_is_a_valid_config():
    for parts in (bench.GPU_PARTS, bench.CPU_PARTS):
        for part in parts.values():
            for spec in engines_of(part):
                if engine_name(spec) == "p12":
                    EngineConfig(model="tiny-llama", device="cpu", **parse_engine_options(",".join(spec.split()[1:])))


def test_workloads_have_the_asked_shapes():
    """128 requests on one 4,096-token system prompt, suffixes block-aligned and not; the control
    shares nothing; 32 sessions x 4 turns."""
    chats = shared_prefix.WORKLOADS["shared-prefix", "full"]
    prompts = chats.beginnings()
    assert len(prompts) == 128 and len({tuple(p[:4096]) for p in prompts}) == 1
    assert len({tuple(p[4096:]) for p in prompts}) == 128
    aligned = [(len(p) - 4096) % shared_prefix.BLOCK == 0 for p in prompts]
    assert all(aligned[::2]) and not any(aligned[1::2])
    control = shared_prefix.WORKLOADS["no-sharing", "full"].beginnings()
    assert [len(p) for p in control] == [len(p) for p in prompts]
    assert len({tuple(p[:shared_prefix.BLOCK]) for p in control}) == 128
    turns = shared_prefix.WORKLOADS["multi-turn", "full"]
    assert (turns.sessions, turns.turns, len(turns.messages()[0])) == (32, 4, 3)


def fake_output(prompt, answer, arrival):
    return SimpleNamespace(prompt_token_ids=prompt, token_ids=answer, arrival_time=arrival)


def test_ideal_hit_rate_counts_full_blocks_of_earlier_requests_never_the_last_token():
    """Block size 4. The first request finds nothing; the second shares 9 tokens with it (2 full
    blocks); the third is the first's prompt and answer plus more (its answer's last token was
    never computed: 12 + 3 = 15 tokens are known, 3 full blocks); the fourth
    equals the first (12 tokens, 3 blocks, but its last token is computed: 2 blocks)."""
    first = list(range(12))
    outs = [fake_output(first, [90, 91, 92, 93], 0), fake_output(first[:9] + [50, 51, 52], [1], 1),
            fake_output(first + [90, 91, 92, 93, 7, 8], [1], 2), fake_output(first, [1], 3)]
    hits = 0 + 2 * 4 + 3 * 4 + 2 * 4
    assert shared_prefix.ideal_hit_rate(outs, block_size=4) == hits / (12 + 12 + 18 + 12)


def test_readme_shared_prefix_lines_are_generated():
    """The README's shared-prefix headline and table are what `python -m common.shared_prefix
    readme` writes now."""
    text = (Path(__file__).resolve().parents[2] / "phases" / PHASE / "README.md").read_text()
    records = read_records(PHASE)
    for name, body in (("headline", shared_prefix.headline(records, PHASE)), ("chat", shared_prefix.chat_line(records, PHASE)),
                       ("table", shared_prefix.results_table(records, PHASE))):
        m = re.search(rf"<!-- shared-prefix:{name} -->\n(.*?)\n<!-- /shared-prefix:{name} -->", text, re.S)
        assert m and m.group(1) == body, f"README {name} is stale: run python -m common.shared_prefix readme {PHASE}"
