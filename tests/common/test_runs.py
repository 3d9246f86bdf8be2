"""common.runs on synthetic result files in a temporary repository root, and on this checkout."""
import json
from pathlib import Path

from common import runs

ROOT = Path(__file__).resolve().parent.parent.parent
PHASE = "p03_vectorized_gather"          # a phase with a headline in common.report.HEADLINES


def record(engine, run, sha, utc, samples, concurrency=64, device="NVIDIA H200", part="concurrency"):
    return {"phase": PHASE, "engine": engine, "workload": "concurrency", "preset": "llama-1b",
            "dtype": "bfloat16", "scale": "full", "setting": {"concurrency": concurrency}, "device": device,
            "run_id": run, "part": part, "repeats": len(samples),
            "metrics": {"output_tok_s": sorted(samples)[len(samples) // 2]},
            "samples": [{"repeat": i, "output_tok_s": v} for i, v in enumerate(samples)],
            "provenance": {"git_sha": sha, "utc": utc, "device": device,
                           "make_command": f"make phase-03 bench PART={part}"}}


def write(root, name, recs):
    path = root / "results" / PHASE / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(recs))


def make_repo(tmp_path):
    write(tmp_path, "concurrency-h200.json", [
        record("p02", "new-run", "bbbbbbb1234", "2030-01-02T10:00:00+00:00", [100.0, 100.0, 100.0]),
        record("p02#2", "new-run", "bbbbbbb1234", "2030-01-02T10:00:00+00:00", [95.0, 100.0, 105.0]),
        record("p03", "new-run", "bbbbbbb1234", "2030-01-02T10:00:00+00:00", [300.0, 350.0, 400.0])])
    write(tmp_path, "history/concurrency-h200.json", [
        record("p02", "old-run", "aaaaaaa1234", "2030-01-01T10:00:00+00:00", [100.0, 100.0, 100.0]),
        record("p03", "old-run", "aaaaaaa1234", "2030-01-01T10:00:00+00:00", [99.0, 100.0, 102.0])])
    return tmp_path


def runs_md(root):
    return (root / "results" / PHASE / "RUNS.md").read_text()


def test_every_run_with_commit_state_and_ratio(tmp_path):
    root = make_repo(tmp_path)
    assert runs.main(["--root", str(root)]) == 0
    text = runs_md(root)
    assert "## PART=concurrency" in text
    old, new = text.index("`old-run`: superseded"), text.index("`new-run`: current")
    assert old < new, "runs are listed oldest first"
    assert "git aaaaaaa" in text and "git bbbbbbb" in text and "2030-01-02 10:00 UTC" in text
    assert "engines: p02, p02#2, p03" in text
    assert "p03 vs p02 **(headline)**" in text                     # the phase's HEADLINES comparison
    assert "3.50× (3.00–4.00)" in text                              # per repeat pair: 3.0, 3.5, 4.0
    assert "p02#2 vs p02 (A/A control)" in text                     # the twin over its baseline, as
    assert "p03 vs p02#2" not in text                               # the report states it, and over
    assert "1.000× (0.950–1.050), the A/A range" in text            # nothing else


def test_hand_written_section_survives_a_rewrite(tmp_path):
    root = make_repo(tmp_path)
    runs.main(["--root", str(root)])
    path = root / "results" / PHASE / "RUNS.md"
    path.write_text(path.read_text().replace("## PART=concurrency", "## PART=edited by hand")
                    + "\nOpen question: why did the old run differ?\n")
    assert runs.main(["--root", str(root), "--check"]) == 1
    assert runs.main(["--root", str(root)]) == 0
    text = runs_md(root)
    assert "edited by hand" not in text, "the generated part is regenerated"
    assert text.rstrip().endswith("Open question: why did the old run differ?")
    assert text.count(runs.HAND_MARKER) == 1
    assert runs.main(["--root", str(root), "--check"]) == 0


def test_part_from_the_make_command_when_the_record_has_none(tmp_path):
    rec = record("p03", "r", "c", "2030-01-01T00:00:00+00:00", [1.0], part="gather")
    del rec["part"]
    assert runs.part_of(rec) == "gather"
    del rec["provenance"]["make_command"]
    assert runs.part_of(rec) == "-"


def test_committed_runs_pages_are_current():
    """results/*/RUNS.md is what `python -m common.runs` writes from the committed records."""
    assert runs.main(["--root", str(ROOT), "--check"]) == 0, "run `python -m common.runs` and commit RUNS.md"


def test_runs_from_p11_on_say_whether_they_have_the_masked_chunk_fix():
    """The masked-chunk prefill fix (runs.CHUNK_FIX) changed how p11 on prefill a chunk after cached
    keys: a run's commit before it is marked "no", from it on "yes"; phases before p11 say nothing."""
    assert runs.chunk_fix_note("9f6666d", "p10_review", runs.ROOT) == ""
    assert runs.chunk_fix_note("9f6666d", "p15_flash_decoding", runs.ROOT).endswith("(masked-chunk prefill): no")
    assert runs.chunk_fix_note(runs.CHUNK_FIX, "p19_quantization", runs.ROOT).endswith("(masked-chunk prefill): yes")


def test_a_cold_first_round_is_counted_per_run():
    """Round 0 below 0.8x the later rounds' median is a cold first round; fewer than three rounds
    say nothing."""
    cold = record("p02", "r", "aaaaaaa1234", "2030-01-01T10:00:00+00:00", [70.0, 100.0, 104.0])
    warm = record("p02", "r", "aaaaaaa1234", "2030-01-01T10:00:00+00:00", [90.0, 100.0, 104.0])
    short = record("p02", "r", "aaaaaaa1234", "2030-01-01T10:00:00+00:00", [10.0, 100.0])
    assert runs.cold_first_round(cold) and not runs.cold_first_round(warm)
    assert runs.cold_first_round(short) is None
    assert runs.cold_text([cold, warm, short]) == "1 of 2 records"


def test_every_recorded_workload_has_a_main_metric_or_is_unpaired():
    """A workload that compares engines must name the metric its ratios use, or RUNS.md lists its
    runs as "no ratios" (p13's acceptance and p12's no-sharing, multi-turn and chat once did)."""
    workloads = {rec.get("workload") for file in (ROOT / "results").glob("*/*.json")
                 for rec in json.loads(file.read_text())}
    missing = {w for w in workloads if runs.main_metric(w or "") is None and w not in runs.UNPAIRED}
    assert not missing, f"workloads with no main metric: {sorted(missing)}"


def test_engines_on_different_prompt_sets_are_not_paired():
    """p13's acceptance runs every engine on two prompt sets, named in the engine label: a ratio
    across the sets compares workloads, so RUNS.md pairs within a set only."""
    assert runs.workload_options("p13 prompts=open speculative=ngram") == ("prompts=open",)
    assert runs.workload_options("p12#2") == ()
