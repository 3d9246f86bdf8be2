"""The phase's bench set: acceptance on the real model (CPU) and the speed sweep at a scripted
acceptance (H200), each with the previous phase built twice (the A/A control); the scripted
proposer's drafts; the runner end to end at tiny scale; the README's tables generated. And
ServedLLM, inherited: it gives the offline engine's tokens and dies with its parent."""
import importlib
import re
from pathlib import Path
from types import SimpleNamespace

from common import spec_decode
from common.bench import engine_name, parse_engine_options
from common.results import read_records
from tests.suites.served import *  # noqa: F401,F403 - ServedLLM's tests and fixtures, collected here

PHASE = "p13_speculative_decoding"
bench = importlib.import_module(f"phases.{PHASE}.bench")
EngineConfig = importlib.import_module(f"phases.{PHASE}.config").EngineConfig


def test_every_part_carries_the_aa_control_and_this_engine():
    for parts in (bench.GPU_PARTS, bench.CPU_PARTS):
        for name, part in parts.items():
            assert part.engines[:2] == ["p12", "p12#2"], name
            assert any(engine_name(e) == "p13" for e in part.engines), name


def test_the_parts_measure_the_goals_settings():
    """Batches 1, 4, 16, 64 on llama-8b, acceptance 0.3 to 0.95 and k = 2, 4, 8 (64: the switch
    against speculating anyway); acceptance on the real model on the CPU, and on the GPU with p13
    itself (speculation off) in the run: the real proposers against the engine without them."""
    gpu = bench.GPU_PARTS
    assert set(gpu) == {"acceptance", "acceptance-draft", "speed-1", "speed-4", "speed-16", "speed-64"}
    assert all(gpu[f"speed-{b}"].preset == "llama-8b" for b in (1, 4, 16, 64))
    assert all(gpu[p].preset == "smollm2-135m" and "p13" in gpu[p].engines for p in ("acceptance", "acceptance-draft"))
    args = spec_decode.parse_args(["speed", "--phase", PHASE, "--engines", "p12", *gpu["speed-1"].extra])
    assert (args.batches, args.acceptances, args.ks) == ([1], [0.3, 0.6, 0.8, 0.95], [2, 4, 8])
    assert "default,64" in gpu["speed-64"].extra
    assert bench.CPU_PARTS["acceptance"].preset == "smollm2-135m"


def test_every_engine_spec_is_a_valid_config():
    for parts in (bench.GPU_PARTS, bench.CPU_PARTS):
        for part in parts.values():
            for spec in part.engines:
                if engine_name(spec) == "p13":
                    EngineConfig(model="tiny-llama", device="cpu", **parse_engine_options(",".join(spec.split()[1:])))


def test_scripted_proposer_keeps_the_asked_share_of_tokens():
    truth = list(range(100, 1100))
    proposer = spec_decode.ScriptedProposer(vocab_size=50_000, acceptance=0.8)
    proposer.script[(1, 2, 3)] = truth
    seq = SimpleNamespace(prompt_ids=[1, 2, 3], output_ids=[0] * 5)
    [draft] = proposer.propose([seq], 4)
    assert len(draft.token_ids) == 4 and draft.probs is None
    kept = [d == t for i in range(0, 1000, 4) for d, t in zip(proposer.draft((1, 2, 3), i, 4), truth[i:i + 4])]
    assert 0.75 < sum(kept) / len(kept) < 0.85
    assert proposer.draft((1, 2, 3), 7, 4) == proposer.draft((1, 2, 3), 7, 4)       # the same drafts every time
    assert proposer.draft((9,), 0, 4) == []                                           # no script: no drafts


def test_speed_runner_at_tiny_scale(tmp_path, monkeypatch):
    """p12, its twin and p13 over two scripted settings at batch 1 on tiny-llama: the records carry
    the measured acceptance, TPOT, and the A/A pair; the drafts kept at 0.95 outnumber those at 0.3."""
    monkeypatch.setattr(spec_decode, "RESULTS", tmp_path)
    records = spec_decode.main(["speed", "--phase", PHASE, "--presets", "tiny-llama", "--engines",
                                "p12,p12#2,p13 speculative=ngram", "--batches", "1", "--acceptances", "0.3,0.95",
                                "--ks", "4", "--scale", "small", "--repeats", "1", "--device", "cpu"])
    labels = [spec_decode.spec_label(r) for r in records]
    assert labels == ["p12", "p12#2 (A/A)", "p13 scripted k=4 α=0.3", "p13 scripted k=4 α=0.95"]
    low, high = records[2]["metrics"], records[3]["metrics"]
    assert low["acceptance_rate"] < high["acceptance_rate"] and high["tokens_per_step"] > 2
    assert records[3]["metrics"]["script_replayed"] == 1.0      # every request's recorded path given back
    assert "script_replayed" not in records[0]["metrics"]         # p12: no script
    assert all(r["workload"] == "latency" and r["setting"]["batch"] == 1 and "tpot_p50_ms" in r["metrics"] for r in records)
    assert (tmp_path / PHASE / "speed-cpu.json").is_file()


def test_readme_tables_are_generated():
    """The README's tables are what `python -m common.spec_decode readme` writes now."""
    text = (Path(__file__).resolve().parents[2] / "phases" / PHASE / "README.md").read_text()
    records = read_records(PHASE)
    for name, body in (("headline", spec_decode.headline(records)), ("acceptance", spec_decode.acceptance_table(records)),
                       ("speed", spec_decode.speed_table(records, PHASE, alphas=spec_decode.README_ALPHAS.get(PHASE)))):
        m = re.search(rf"<!-- spec-decode:{name} -->\n(.*?)\n<!-- /spec-decode:{name} -->", text, re.S)
        assert m and m.group(1) == body, f"README {name} table is stale: run python -m common.spec_decode readme {PHASE}"


def test_speed_table_keeps_every_batch_size_newest_run():
    """Each speed-N part is its own run: the table shows the newest run of every batch size (a
    newer batch-64 run must not hide batch 4 and 16), at the README's asked acceptances."""
    records = read_records(PHASE)
    sizes = {r["setting"].get("concurrency", 1) for r in records
             if r["device"] == "NVIDIA H200" and r["file"].endswith("speed-h200.json")}
    table = spec_decode.speed_table(records, PHASE, alphas=spec_decode.README_ALPHAS[PHASE])
    cells = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")]
    shown = {int(c) for c in cells if c.isdigit()}
    assert shown == sizes and len(sizes) > 1
    assert "α=0.6" not in table and "α=0.8" in table


def test_speed_engines_prefill_every_prompt_in_one_step():
    """Chunk boundaries that drafts move change bf16 K/V and lose the script: the speed harness
    gives every engine a budget that prefills the whole batch, drafts included, in one step."""
    args = spec_decode.parse_args(["speed", "--phase", PHASE, "--presets", "tiny-llama", "--engines", "p12",
                                   "--ks", "2,4", "--device", "cpu"])
    assert spec_decode.one_step_budget([[1] * 512] * 16, args) == 16 * 512 + 16 * 5
    assert spec_decode.one_step_budget([[1] * 512], args) == 2048          # never below the default
    engine = spec_decode.build("p13 speculative=ngram", "tiny-llama", args, [[1] * 300] * 8, [])
    assert engine.config.max_num_batched_tokens == 8 * 300 + 8 * 5


def test_headline_gives_each_devices_acceptance_gpu_first():
    """The line under the speed headline: each acceptance file's newest run, a GPU's first; the
    acceptance and tokens per step it states are that run's records' own."""
    records = read_records(PHASE)
    line = spec_decode.headline(records)
    runs = sorted({r["file"] for r in records if r["workload"] == "acceptance"}, key=lambda f: f.endswith("-cpu.json"))
    if not runs:
        assert line.startswith("_No acceptance run")
        return
    devices = [spec_decode.newest([r for r in records if r["file"] == f], "acceptance")[0]["device"] for f in runs]
    assert [line.index(f"**{d},") for d in devices] == sorted(line.index(f"**{d},") for d in devices)
    for f in runs:
        grounded = next(r for r in spec_decode.newest([r for r in records if r["file"] == f], "acceptance")
                        if r["setting"].get("speculative") == "ngram" and r["setting"]["num_speculative_tokens"] == 4
                        and r["setting"]["prompts"] == "grounded")
        assert f"keeps {grounded['metrics']['acceptance_rate']:.2f} of its drafts on grounded prompts" in line
