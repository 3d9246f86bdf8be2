"""common.report on synthetic result files in a temporary repository root."""
import json

from common import report

MILESTONES = "<!-- results:milestones -->\nstale text\n<!-- /results:milestones -->"
BEFORE_AFTER = "<!-- results:before-after -->\n<!-- /results:before-after -->"
BANDWIDTH = 4e12


def record(phase, engine, preset, workload="latency", device="NVIDIA H200", run="run-a", samples=None,
           setting=None, **metrics):
    """A record as common.bench writes it; `samples` are the per-repeat values of the main metric."""
    key = "decode_tok_s" if workload == "latency" else "output_tok_s"
    samples = samples or [metrics.get(key, 1.0)] * 3
    return {"phase": phase, "engine": engine, "workload": workload, "preset": preset, "dtype": "bfloat16",
            "scale": "full", "setting": setting or {}, "device": device, "metrics": metrics, "run_id": run,
            "repeats": len(samples), "samples": [{"repeat": i, key: v} for i, v in enumerate(samples)],
            "hardware": {"copy_bytes_per_s": BANDWIDTH},
            "provenance": {"git_sha": "0123456789abcdef", "utc": "2030-01-02T03:04:05+00:00", "device": device,
                           "make_command": f"make phase-{phase[1:3]} bench PART={workload}"}}


def latency(phase, engine, preset, tok_s, floor_ms=1.0, samples=None, **kw):
    """floor_ms: the bandwidth floor per token at BANDWIDTH (the record stores its bytes)."""
    return record(phase, engine, preset, decode_tok_s=tok_s, ms_per_token=1e3 / tok_s,
                  floor_bytes=floor_ms * 1e-3 * BANDWIDTH, roofline_frac=0.0, samples=samples,
                  setting={"batch": 1}, **kw)


def write(root, name, recs):
    (root / "results" / name).parent.mkdir(parents=True, exist_ok=True)
    (root / "results" / name).write_text(json.dumps(recs))


def make_repo(tmp_path):
    write(tmp_path, "p01_serial/latency-h200.json", [
        latency("p01_serial", "p01", "llama-1b", 100.0, samples=[100.0, 90.0, 110.0]),
        latency("p01_serial", "hf-static", "llama-1b", 400.0, samples=[400.0, 400.0, 400.0])])
    write(tmp_path, "p01_serial/latency-cpu.json", [latency("p01_serial", "p01", "tiny-llama", 1000.0, device="cpu")])
    write(tmp_path, "p02_next/latency-h200.json", [
        latency("p02_next", "p01", "llama-1b", 100.0, run="run-b", samples=[100.0, 100.0, 100.0]),
        latency("p02_next", "p02", "llama-1b", 250.0, run="run-b", samples=[250.0, 200.0, 300.0])])
    write(tmp_path, "p02_next/offline-h200.json", [
        record("p02_next", "p02", "llama-1b", "offline", run="run-c", output_tok_s=5000.0, total_tok_s=9000.0)])
    for phase in ("p01_serial", "p02_next", "p03_unwritten"):
        (tmp_path / "phases" / phase).mkdir(parents=True)
    (tmp_path / "README.md").write_text(f"# top\n\n{MILESTONES}\n\nafter\n")
    (tmp_path / "phases/p02_next/README.md").write_text(f"# p02\n{BEFORE_AFTER}\n")
    (tmp_path / "phases/p01_serial/README.md").write_text("# p01 without markers\n")
    return tmp_path


def rows(text):
    return [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]


def test_ladder_ratios_come_from_each_phase_own_run(tmp_path):
    """The ladder is its own page, results/LADDER.md, written by the run that rewrites the READMEs:
    GPU rows only (a CPU's runs are not comparable across runs: the page says so), phase links
    relative to results/, and the runs behind each absolute column named."""
    root = make_repo(tmp_path)
    assert report.main(["--root", str(root)]) == 0
    h200 = (root / "results/LADDER.md").read_text()
    assert h200.startswith("# The ladder") and "**cpu**" not in h200 and "tiny-llama" not in h200
    assert "CPU numbers are not laddered" in h200
    assert rows(h200)[0].startswith("| phase | engine | model | decode tok/s | ms/token | % of roofline "
                                    "| vs previous phase | vs hf-static |")
    # p01 vs hf-static per repeat: 100/400, 90/400, 110/400; floor 1 ms at 10 ms/token -> 10%
    assert rows(h200)[1].startswith("| [p01_serial](../phases/p01_serial) | p01 | llama-1b | 100 | 10.00 | 10.0% "
                                    "| – | 0.25× (0.23–0.28) loss; no A/A |")
    # p02 vs p01 from p02's own run (2.5, 2.0, 3.0); no hf-static in that run: the cell stays empty
    assert rows(h200)[2].startswith("| [p02_next](../phases/p02_next) | p02 | llama-1b | 250 | 4.00 | 25.0% "
                                    "| 2.50× (2.00–3.00); no A/A | – |")
    assert rows(h200)[2].endswith("| 5,000 | B / – / C |")       # each absolute column names its run
    assert "_Runs behind the absolute columns (latency / c / offline): A = run run-a (" in h200
    assert "`results/p01_serial/latency-h200.json` (`make phase-01 bench PART=latency`, git 0123456, " \
           "2030-01-02 UTC, NVIDIA H200)" in h200


def test_milestones_give_each_phase_its_headline_ratio(tmp_path, monkeypatch):
    """The top README's table: a row per phase with a headline and records, its same-run ratio as
    the headline states it (no run ids), a link to the phase; a phase without a same-run baseline
    says so."""
    root = make_repo(tmp_path)
    monkeypatch.setattr(report, "HEADLINES", {
        "p01_serial": ("latency", "llama-1b", {"batch": 1}, "p01", "hf-static", "NVIDIA H200"),
        "p02_next": ("latency", "llama-1b", {"batch": 1}, "p02", "p01", "NVIDIA H200"),
        "p03_unwritten": ("latency", "llama-1b", {"batch": 1}, "p03", "p02", "NVIDIA H200")})
    write(root, "p02_next/offline-h200.json", [record("p02_next", "p02", "llama-1b", "offline", run="run-c",
                                                      output_tok_s=5000.0, total_tok_s=9000.0)])
    assert report.main(["--root", str(root)]) == 0
    text = (root / "README.md").read_text()
    assert "stale text" not in text and text.endswith("<!-- /results:milestones -->\n\nafter\n")
    assert rows(text) == [
        "| phase | comparison | metric, setting | ratio |",
        "| [p01_serial](phases/p01_serial/README.md) | p01 vs hf-static | decode tok/s, batch 1, llama-1b "
        "| **0.25× (0.23–0.28) loss; no A/A** |",
        "| [p02_next](phases/p02_next/README.md) | p02 vs p01 | decode tok/s, batch 1, llama-1b "
        "| **2.50× (2.00–3.00); no A/A** |"]                  # p03 has no records: no row
    assert "run-a" not in text and "run-b" not in text
    monkeypatch.setitem(report.HEADLINES, "p02_next", ("latency", "llama-1b", {"batch": 1}, "p02", "hf-static",
                                                       "NVIDIA H200"))
    assert "| no same-run measurement yet |" in report.milestones(report.load_records(root))
    assert report.setting_text(("kv_cache_bytes", 2 << 30)) == "KV pool 2 GiB"
    assert report.setting_text(("concurrency", 64)) == "c=64"


def test_ratio_whose_range_includes_one_is_noise(tmp_path):
    recs = [latency("p02_next", "p01", "llama-1b", 100.0, samples=[100.0, 100.0, 100.0]),
            latency("p02_next", "p02", "llama-1b", 105.0, samples=[105.0, 95.0, 110.0])]
    write(tmp_path, "p02_next/latency-h200.json", recs)
    table = report.before_after(report.load_records(tmp_path), "p02_next", "NVIDIA H200", "latency")
    assert rows(table)[1].endswith("| no A/A | 1.05× (0.95–1.10) noise |")


def test_before_after_takes_the_previous_phase_from_this_phase_only(tmp_path):
    root = make_repo(tmp_path)
    report.main(["--root", str(root)])
    text = (root / "phases/p02_next/README.md").read_text()
    latency_table, offline_table = text.split("offline throughput")
    assert rows(latency_table) == [
        "| model | p01 | **p02** | p02 ms/token | p02 % of roofline | A/A (same run) | p02 vs p01 |",
        "| llama-1b | 100 | 250 | 4.00 | 25.0% | no A/A | 2.50× (2.00–3.00) |"]
    assert "median of 3 repeats" in latency_table and "noise" in latency_table
    assert rows(offline_table) == ["| model | **p02** | p02 total tok/s | A/A (same run) |",
                                   "| llama-1b | 5,000 | 9,000 | no A/A |"]
    assert "_Source: `results/p02_next/latency-h200.json`" in latency_table
    assert "p01_serial" not in latency_table
    assert (root / "phases/p01_serial/README.md").read_text() == "# p01 without markers\n"


def test_records_of_two_runs_give_no_ratio(tmp_path):
    recs = [latency("p02_next", "p01", "llama-1b", 100.0, run="one"), latency("p02_next", "p02", "llama-1b", 250.0, run="two")]
    write(tmp_path, "p02_next/latency-h200.json", recs)
    table = report.before_after(report.load_records(tmp_path), "p02_next", "NVIDIA H200", "latency")
    assert rows(table)[1].endswith("| 100 | 250 | 4.00 | 25.0% | no A/A | – |")


def test_best_knows_which_way_is_better():
    fast = {"metrics": {"decode_tok_s": 200.0, "ms_per_token": 5.0}}
    slow = {"metrics": {"decode_tok_s": 100.0, "ms_per_token": 10.0}}
    assert report.best([slow, fast], "decode_tok_s") is fast
    assert report.best([slow, fast], "ms_per_token") is fast


def test_one_bandwidth_per_device_for_the_roofline(tmp_path):
    """Two runs measured 2 and 4 TB/s; both phases divide their floor bytes by the median (3)."""
    a = latency("p01_serial", "p01", "llama-1b", 100.0)
    b = latency("p02_next", "p02", "llama-1b", 100.0)
    a["hardware"]["copy_bytes_per_s"], b["hardware"]["copy_bytes_per_s"] = 2e12, 4e12
    write(tmp_path, "p01_serial/latency-h200.json", [a])
    write(tmp_path, "p02_next/latency-h200.json", [b])
    fracs = {r["phase"]: r["metrics"]["roofline_frac"] for r in report.load_records(tmp_path)}
    assert fracs["p01_serial"] == fracs["p02_next"] == 1e-3 * BANDWIDTH / 3e12 * 1e3 / 10.0


def test_headline_is_one_same_run_ratio_with_its_command(tmp_path, monkeypatch):
    root = make_repo(tmp_path)
    monkeypatch.setitem(report.HEADLINES, "p02_next", ("latency", "llama-1b", {"batch": 1}, "p02", "p01", "NVIDIA H200"))
    text = report.headline(report.load_records(root), "p02_next", report.load_history(root))
    assert text.startswith("**2.50× (2.00–3.00); no A/A** decode tok/s, p02 vs p01 (batch=1, llama-1b, bfloat16, NVIDIA H200;")
    assert text.endswith("one run). Reproduce: `make phase-02 bench PART=latency`.")   # one run: no spread across runs
    monkeypatch.setitem(report.HEADLINES, "p02_next", ("latency", "llama-1b", {"batch": 1}, "p02", "hf-static", "NVIDIA H200"))
    assert "No same-run measurement" in report.headline(report.load_records(root), "p02_next", [])


def test_headline_gives_the_spread_across_earlier_runs_of_its_part(tmp_path, monkeypatch):
    """Earlier runs of the same part (results/*/history/) add their medians and pairs; the bold
    ratio stays the newest run's, and a run made by another part is left out."""
    root = make_repo(tmp_path)
    monkeypatch.setitem(report.HEADLINES, "p02_next", ("latency", "llama-1b", {"batch": 1}, "p02", "p01", "NVIDIA H200"))
    older = [latency("p02_next", "p01", "llama-1b", 100.0, run="run-0", samples=[100.0, 100.0, 100.0]),
             latency("p02_next", "p02", "llama-1b", 180.0, run="run-0", samples=[180.0, 150.0, 400.0])]
    other_part = [latency("p02_next", e, "llama-1b", t, run="run-x", samples=[t] * 3) for e, t in (("p01", 10.0), ("p02", 990.0))]
    for r in older + other_part:
        r["provenance"]["utc"] = "2030-01-01T00:00:00+00:00"
    for r in other_part:
        r["provenance"]["make_command"] = "make phase-02 bench PART=latency-8b"
    write(root, "p02_next/history/latency-h200.json", older + other_part)
    text = report.headline(report.load_records(root), "p02_next", report.load_history(root))
    assert text.startswith("**2.50× (2.00–3.00); no A/A** decode tok/s")
    assert ("one run). Across the 2 runs of this part in results/, all at the same code (git 0123456, 0123456, "
            "oldest first): run medians 1.80–2.50×, repeat pairs 1.50–4.00×; the newest run's median lies inside "
            "the pairs of the run before it (1.50–4.00×). Reproduce: `make phase-02 bench PART=latency`.") in text
    older[1]["samples"] = [{"repeat": i, "decode_tok_s": v} for i, v in enumerate([110.0, 120.0, 130.0])]
    write(root, "p02_next/history/latency-h200.json", older)
    text = report.headline(report.load_records(root), "p02_next", report.load_history(root))
    assert "run medians 1.20–2.50×, repeat pairs 1.10–3.00×; the newest run's median lies outside" in text
    assert "(1.10–1.30×)" in text
    runs = rows(report.runs_table(report.load_records(root) + report.load_history(root), "p02_next"))
    assert runs[0] == "| run (UTC) | git | repeats | p02 | p01 | A/A | p02 vs p01 |"
    assert [r.split(" | ")[-1] for r in runs[1:]] == ["1.20× (1.10–1.30) |", "2.50× (2.00–3.00) |"]  # oldest first


def test_headline_does_not_judge_a_run_of_other_code(tmp_path, monkeypatch):
    """An earlier run at another commit measured other code: the headline says the code changed
    between the runs instead of calling the newest run's ratio a failed reproduction; runs at the
    newest run's code are still compared with it."""
    root = make_repo(tmp_path)
    monkeypatch.setitem(report.HEADLINES, "p02_next", ("latency", "llama-1b", {"batch": 1}, "p02", "p01", "NVIDIA H200"))

    def run(name, utc, sha, tok_s):
        recs = [latency("p02_next", "p01", "llama-1b", 100.0, run=name, samples=[100.0] * 3),
                latency("p02_next", "p02", "llama-1b", tok_s, run=name, samples=[tok_s, tok_s - 20, tok_s + 20])]
        for r in recs:
            r["provenance"] |= {"utc": utc, "git_sha": sha}
        return recs
    write(root, "p02_next/history/latency-h200.json", run("run-0", "2030-01-01T00:00:00+00:00", "fedcba9876543210", 120.0))
    text = report.headline(report.load_records(root), "p02_next", report.load_history(root))
    assert ("one run). An earlier run of this part in results/ measured other code: the code changed between these "
            "runs (git fedcba9 → 0123456), so it is not compared with this one (every run: "
            "`results/p02_next/RUNS.md`). Reproduce:") in text
    assert "Across" not in text and "outside" not in text
    older = run("run-0", "2030-01-01T00:00:00+00:00", "fedcba9876543210", 120.0) \
        + run("run-1", "2030-01-01T01:00:00+00:00", "0123456789abcdef", 240.0)
    write(root, "p02_next/history/latency-h200.json", older)
    text = report.headline(report.load_records(root), "p02_next", report.load_history(root))
    assert "An earlier run of this part in results/ measured other code" in text
    assert ("Across the 2 runs at this code (git 0123456, 0123456, oldest first): run medians 2.40–2.50×, repeat "
            "pairs 2.00–3.00×; the newest run's median lies inside the pairs of the run before it (2.20–2.60×).") in text
    dirty = run("run-2", "2030-01-01T02:00:00+00:00", "0123456789abcdef-dirty", 240.0)
    assert report.code_of(dirty[1], "p02_next") != report.code_of(older[3], "p02_next")


def test_headline_names_the_workload_and_part_of_a_setting_free_headline(tmp_path, monkeypatch):
    rec = record("p11_x", "p11", "llama-1b", "long-mix", itl_p99_ms=10.0, samples=[10.0] * 3) | {"part": "long-mix"}
    base = record("p11_x", "p10", "llama-1b", "long-mix", itl_p99_ms=20.0, samples=[20.0] * 3) | {"part": "long-mix"}
    for r in (rec, base):
        r["samples"] = [{"repeat": i, "itl_p99_ms": r["metrics"]["itl_p99_ms"]} for i in range(3)]
    write(tmp_path, "p11_x/long-mix-h200.json", [rec, base])
    monkeypatch.setitem(report.HEADLINES, "p11_x", ("long-mix", "llama-1b", {}, "p11", "p10", "NVIDIA H200"))
    text = report.headline(report.load_records(tmp_path), "p11_x", [])
    assert "(long-mix workload, PART=long-mix, llama-1b," in text and "standard set" not in text
    assert text.startswith("**2.00× (2.00–2.00); no A/A**")


def test_idempotent_and_check(tmp_path, capsys):
    root = make_repo(tmp_path)
    assert report.main(["--root", str(root), "--check"]) == 1      # fresh markers are stale
    assert "stale text" in (root / "README.md").read_text()          # --check writes nothing
    report.main(["--root", str(root)])
    first = {p: p.read_text() for p in root.rglob("README.md")}
    assert report.main(["--root", str(root)]) == 0
    assert {p: p.read_text() for p in root.rglob("README.md")} == first
    assert report.main(["--root", str(root), "--check"]) == 0
    write(root, "p02_next/latency-h200.json", [latency("p02_next", "p02", "llama-1b", 300.0)])
    assert report.main(["--root", str(root), "--check"]) == 1
    assert "README.md" in capsys.readouterr().out


def test_unknown_marker_and_no_results(tmp_path):
    (tmp_path / "phases/p05_x").mkdir(parents=True)
    odd = "<!-- results:nonsense -->\nkeep\n<!-- /results:nonsense -->"
    (tmp_path / "phases/p05_x/README.md").write_text(f"{odd}\n{BEFORE_AFTER}\n")
    (tmp_path / "README.md").write_text(MILESTONES)
    assert report.main(["--root", str(tmp_path)]) == 0
    text = (tmp_path / "phases/p05_x/README.md").read_text()
    assert odd in text and "No results yet: run `make phase-05 bench`" in text
    assert "No results yet" in (tmp_path / "README.md").read_text()


def test_concurrency_rows_in_numeric_order(tmp_path):
    """One row per concurrency level (8 before 32), previous phase and peer side by side."""
    def conc(engine, c, tok_s):
        return record("p02_next", engine, "llama-1b", "concurrency", setting={"concurrency": c},
                      output_tok_s=tok_s, itl_ms_p50=1e3 / tok_s * c)
    recs = [conc(e, c, t * c) for c in (32, 8) for e, t in [("p01", 10.0), ("p02", 50.0), ("hf-generate", 20.0)]]
    write(tmp_path, "p02_next/concurrency-h200.json", recs)
    (tmp_path / "phases/p02_next").mkdir(parents=True)
    (tmp_path / "phases/p02_next/README.md").write_text(BEFORE_AFTER)
    report.main(["--root", str(tmp_path)])
    text = (tmp_path / "phases/p02_next/README.md").read_text()
    assert "throughput at fixed concurrency" in text
    assert rows(text) == [
        "| model | p01 | **p02** | hf-generate | p02 ITL p50 ms | A/A (same run) | p02 vs p01 | p02 vs hf-generate |",
        "| llama-1b (c=8) | 80.0 | 400 | 160 | 20.00 | no A/A | 5.00× (5.00–5.00) | 2.50× (2.50–2.50) |",
        "| llama-1b (c=32) | 320 | 1,600 | 640 | 20.00 | no A/A | 5.00× (5.00–5.00) | 2.50× (2.50–2.50) |"]


def test_parallel_modes_are_columns_and_ladder_rows_of_their_own(tmp_path):
    """A phase that runs its engine in two parallel modes: one bold column and one ratio per mode,
    and in the ladder one row per mode (never one mode's latency beside the other's throughput)."""
    recs = [latency("p04_par", "p03", "llama-1b", 100.0)]
    for mode, tok_s in [("replica", 190.0), ("pipeline", 80.0)]:
        rec = latency("p04_par", "p04", "llama-1b", tok_s)
        rec["setting"] = {"batch": 1, "parallel": mode, "world_size": 2}
        recs.append(rec)
    write(tmp_path, "p04_par/latency-h200.json", recs)
    records = report.load_records(tmp_path)
    header, row = rows(report.before_after(records, "p04_par", "NVIDIA H200", "latency"))
    assert "**p04 pipeline**" in header and "**p04 replica**" in header
    assert "p04 replica vs p03" in header and "p04 pipeline vs p03" in header
    assert "| 1.90× (1.90–1.90) |" in row and "| 0.80× (0.80–0.80) loss |" in row
    ladder_rows = rows(report.ladder(records))
    assert [r.split(" | ")[1] for r in ladder_rows[1:]] == ["p04 pipeline", "p04 replica"]


def test_profile_rows_per_batch_and_setting(tmp_path):
    """One row per (batch, engine option), batches in numeric order; the marker fills the README."""
    def prof(batch, lean, wall, kernels):
        rec = record("p05_prof", "p05", "llama-1b", "profile", wall_ms_per_step=wall, kernels_per_step=kernels,
                     gpu_busy_ms=2.0, syncs_per_step=7.0, ideal_ms_per_step=0.5, roofline_frac=0.5 / wall)
        return rec | {"setting": {"lean_step": lean, "batch": batch}}
    recs = [prof(b, lean, w, k) for b, lean, w, k in [(64, 0, 12.0, 568.0), (1, 1, 8.0, 414.0), (1, 0, 10.0, 558.0)]]
    write(tmp_path, "p05_prof/profile-h200.json", recs)
    (tmp_path / "phases/p05_prof").mkdir(parents=True)
    (tmp_path / "phases/p05_prof/README.md").write_text("<!-- results:profile -->\n<!-- /results:profile -->\n")
    report.main(["--root", str(tmp_path)])
    text = (tmp_path / "phases/p05_prof/README.md").read_text()
    assert rows(text) == [
        "| model | batch | lean_step | wall ms/step | kernels/step | GPU busy ms | GPU idle "
        "| host µs to prepare inputs | syncs/step | floor ms | % of roofline |",
        "| llama-1b | 1 | 0 | 10.00 | 558 | 2.00 | 80% | – | 7 | 0.500 | 5.0% |",
        "| llama-1b | 1 | 1 | 8.00 | 414 | 2.00 | 75% | – | 7 | 0.500 | 6.2% |",
        "| llama-1b | 64 | 0 | 12.00 | 568 | 2.00 | 83% | – | 7 | 0.500 | 4.2% |"]
    assert "`results/p05_prof/profile-h200.json` (" in text
    assert report.profile_tables([], "p05_prof").startswith("_No profile yet: run `make phase-05 profile`")


def test_ladder_throughput_at_the_top_concurrency_and_no_empty_rows(tmp_path):
    root = make_repo(tmp_path)
    conc = [record("p02_next", e, "llama-1b", "concurrency", run="run-d", setting={"concurrency": c}, output_tok_s=t,
                   samples=[t] * 3) for e, c, t in [("p02", 8, 800.0), ("p02", 64, 6400.0), ("p01", 64, 640.0)]]
    write(root, "p02_next/concurrency-h200.json", conc)
    write(root, "p03_unwritten/gather-h200.json", [record("p03_unwritten", "p03", "llama-1b", "gather", step_ms=1.0)])
    report.main(["--root", str(root)])
    h200 = (root / "results/LADDER.md").read_text()
    assert "| output tok/s at c=64 | vs previous phase at c=64 | offline output tok/s |" in rows(h200)[0]
    assert rows(h200)[2].endswith("| 6,400 | 10.00× (10.00–10.00); no A/A | 5,000 | B / C / D |")
    assert "p03_unwritten" not in h200


def test_offline_sizes_are_rows_and_the_ladder_takes_the_standard_one(tmp_path):
    recs = []
    for requests, scale in [(1024, 2.0), (None, 1.0)]:
        for engine, tok_s in [("p03", 100.0), ("p04", 150.0 * scale)]:
            recs.append(record("p04_par", engine, "llama-1b", "offline", run=f"r{requests}",
                               setting={"requests": requests} if requests else {},
                               output_tok_s=tok_s * scale, total_tok_s=1.0, samples=[tok_s * scale] * 2))
    write(tmp_path, "p04_par/offline-h200.json", recs)
    records = report.load_records(tmp_path)
    _, standard, large = rows(report.before_after(records, "p04_par", "NVIDIA H200", "offline"))
    assert standard.startswith("| llama-1b | 100 | 150 |") and standard.endswith("| 1.50× (1.50–1.50) |")
    assert large.startswith("| llama-1b (1024 requests) | 200 | 600 |") and large.endswith("| 3.00× (3.00–3.00) |")
    assert "| 150 |" in report.ladder(records) and "600" not in report.ladder(records)


def test_ablation_is_a_column_of_its_own_and_stays_out_of_the_ladder(tmp_path):
    """p05 with lean_step=0 is its own bold column beside p05, not hidden by best-of; the ladder
    shows the phase's engine as shipped."""
    recs = [latency("p05_prof", "p04", "llama-1b", 100.0), latency("p05_prof", "p05", "llama-1b", 120.0)]
    off = latency("p05_prof", "p05", "llama-1b", 101.0)
    off["setting"] = {"batch": 1, "lean_step": 0}
    write(tmp_path, "p05_prof/latency-h200.json", recs + [off])
    records = report.load_records(tmp_path)
    header, row = rows(report.before_after(records, "p05_prof", "NVIDIA H200", "latency"))
    assert "**p05**" in header and "**p05 lean_step=0**" in header
    assert "| 1.20× (1.20–1.20) | 1.01× (1.01–1.01) |" in row
    assert "lean_step" not in report.ladder(records)


def test_variants_of_the_phase_engine_are_compared_with_it(tmp_path):
    """A variant of the phase's engine (p09 behind its server, "p09 http"; an ablation like
    "p05 lean_step=0") gets a "vs" column against the plain engine of the same run."""
    plain = record("p09_serve", "p09", "llama-1b", "concurrency", setting={"concurrency": 64},
                   samples=[100.0, 110.0, 90.0], output_tok_s=100.0)
    http = record("p09_serve", "p09", "llama-1b", "concurrency", setting={"concurrency": 64, "server": "http"},
                  samples=[95.0, 99.0, 90.0], output_tok_s=95.0)
    write(tmp_path, "p09_serve/concurrency-h200.json", [plain, http])
    header, row = rows(report.before_after(report.load_records(tmp_path), "p09_serve", "NVIDIA H200", "concurrency"))
    assert header.endswith("| p09 http vs p09 |")
    assert row.endswith("| 0.95× (0.90–1.00) noise |")


def test_cpu_tables_have_no_roofline(tmp_path):
    """A CPU's small presets sit in its caches: no memory-copy floor, so no '% of roofline' column
    in a CPU's ladder (p10 tables its own run's) or the CPU's per-phase latency table, while the
    GPU's keep theirs."""
    root = make_repo(tmp_path)
    write(root, "p02_next/latency-cpu.json", [latency("p02_next", "p01", "tiny-llama", 900.0, device="cpu"),
                                              latency("p02_next", "p02", "tiny-llama", 1000.0, device="cpu")])
    assert report.main(["--root", str(root)]) == 0
    records = report.load_records(root)
    h200, cpu = report.ladder_device(records, "NVIDIA H200"), report.ladder_device(records, "cpu")
    assert "% of roofline" in rows(h200)[0] and "% of roofline" not in cpu
    assert rows(cpu)[1].startswith("| [p01_serial](phases/p01_serial) | p01 | tiny-llama | 1,000 | 1.00 | – |")
    phase_h200, phase_cpu = (root / "phases/p02_next/README.md").read_text().split("**cpu**")
    assert "% of roofline" in phase_h200 and "% of roofline" not in phase_cpu
    assert all(not k.startswith("roofline") for r in report.load_records(root)
               if r["device"] == "cpu" and r["workload"] == "latency" for k in r["metrics"])


def test_ladder_offline_cell_names_a_partial_set(tmp_path):
    """The whole offline set comes first; a part that ran only the first N requests fills the cell
    when nothing else did, and says so."""
    root = make_repo(tmp_path)
    part = record("p01_serial", "p01", "llama-1b", "offline", output_tok_s=86.0, setting={"requests": 8})
    write(root, "p01_serial/offline-h200.json", [part | {"scale": "small"}])
    assert report.main(["--root", str(root)]) == 0
    h200 = (root / "results/LADDER.md").read_text()
    assert rows(h200)[1].endswith("| 86.0 (small, 8 requests) | A / – / A |")
    assert rows(h200)[2].endswith("| 5,000 | B / – / C |")                  # p02's whole set: no label


def test_aa_control_turns_an_old_rule_gain_into_noise(tmp_path):
    """p07 1.12x (1.03-1.24) over p06 beside the run's A/A pair p06#2/p06 of 0.88-1.12: the old rule
    said gain, the A/A rule says noise; the twin is no column, its range is the A/A column."""
    recs = [latency("p07_next", "p06", "llama-1b", 100.0, samples=[100.0, 100.0, 100.0]),
            latency("p07_next", "p06#2", "llama-1b", 100.0, samples=[88.0, 112.0, 100.0]),
            latency("p07_next", "p07", "llama-1b", 112.0, samples=[103.0, 124.0, 112.0])]
    write(tmp_path, "p07_next/latency-h200.json", recs)
    records = report.load_records(tmp_path)
    header, row = rows(report.before_after(records, "p07_next", "NVIDIA H200", "latency"))
    assert "p06#2" not in header and header.endswith("| A/A (same run) | p07 vs p06 |")
    assert row.endswith("| A/A 0.88–1.12 | 1.12× (1.03–1.24) noise |")
    assert "1.12× (1.03–1.24) noise; A/A 0.88–1.12" in report.ladder(records)
    old_rule = [r for r in records if r["engine"] != "p06#2"]            # the same run without its control
    assert "1.12× (1.03–1.24); no A/A" in report.ladder(old_rule)


def test_ladder_finds_the_previous_phase_under_its_variant_label(tmp_path):
    """p07's runs name their baseline "p06 flash-attn": the ladder's p07 row still finds it."""
    base = latency("p07_next", "p06", "llama-1b", 100.0, samples=[100.0, 100.0, 100.0])
    mine = latency("p07_next", "p07", "llama-1b", 150.0, samples=[150.0, 160.0, 140.0])
    base["setting"] = {"batch": 1, "attention_backend": "flash-attn"}
    mine["setting"] = {"batch": 1, "attention_backend": "triton"}
    write(tmp_path, "p07_next/latency-h200.json", [base, mine])
    [row] = rows(report.ladder(report.load_records(tmp_path)))[1:]
    assert "| p07 triton | llama-1b | 150 |" in row and "| 1.50× (1.40–1.60); no A/A |" in row


def test_ladder_labels_a_small_kv_pool(tmp_path):
    """p08's 2 GiB-pool offline numbers are named as such, and an ample-pool run comes first."""
    small = record("p08_pre", "p08", "llama-1b", "offline", run="small", output_tok_s=3000.0,
                   setting={"kv_cache_bytes": 2 << 30})
    write(tmp_path, "p08_pre/offline-h200.json", [small])
    assert "| 3,000 (KV pool 2 GiB) |" in report.ladder(report.load_records(tmp_path))
    ample = record("p08_pre", "p08", "llama-1b", "offline", run="ample", output_tok_s=5000.0)
    write(tmp_path, "p08_pre/offline-h200.json", [small, ample])
    records = report.load_records(tmp_path)
    assert "| 5,000 |" in report.ladder(records) and "(KV pool" not in report.ladder(records)
    assert "llama-1b (KV pool 2 GiB)" in report.before_after(records, "p08_pre", "NVIDIA H200", "offline")


def test_an_unreadable_result_file_is_named_not_dropped(tmp_path, capsys):
    root = make_repo(tmp_path)
    (root / "results/p02_next/concurrency-h200.json").write_text("")            # emptied by an interrupt
    (root / "results/p02_next/gather-h200.json").write_text('[{"phase": "p02_next",')  # cut short
    assert report.main(["--root", str(root)]) == 0
    err = capsys.readouterr().err
    assert "WARNING: cannot read results/p02_next/concurrency-h200.json (JSONDecodeError" in err
    assert "results/p02_next/gather-h200.json" in err
    for readme in ("README.md", "phases/p02_next/README.md"):
        text = (root / readme).read_text()
        assert "**Unreadable result file** `results/p02_next/concurrency-h200.json` (JSONDecodeError" in text
        assert "**Unreadable result file** `results/p02_next/gather-h200.json`" in text


def test_aa_noise_table_lists_every_run_and_setting_with_its_width():
    """p10's aa-noise block: one row per run and noise-control setting, current and history alike,
    the twin's own records left out; without a run it says how to make one."""
    def rec(run, control, lo, hi, utc, engine="p10"):
        return {"phase": "p10_review", "part": "aa-noise", "engine": engine, "run_id": run, "device": "NVIDIA H200",
                "setting": {"concurrency": 64, "noise_control": control},
                "aa": {"median": 1.0, "min": lo, "max": hi, "pairs": 6},
                "provenance": {"git_sha": "abcdef123", "utc": utc}}
    current = [rec("r2", "on", 0.95, 1.05, "2026-12-02T07:00"), rec("r2", "on", 0.95, 1.05, "2026-12-02T07:00", "p10#2")]
    older = [rec("r1", "off", 0.80, 1.30, "2026-12-02T06:00")]
    table = report.aa_noise_table(current, older, "p10_review")
    rows = table.splitlines()[2:]
    assert rows == ["| r1 | abcdef1 | 2026-12-02T06:00 | NVIDIA H200 | off | 6 | 1.00× (0.80–1.30) | 0.50 |",
                    "| r2 | abcdef1 | 2026-12-02T07:00 | NVIDIA H200 | on | 6 | 1.00× (0.95–1.05) | 0.10 |"]
    assert "make phase-10 bench PART=aa-noise" in report.aa_noise_table([], [], "p10_review")


def test_counts_print_as_whole_numbers():
    """p08's table quotes preemptions: 189, not 189.00."""
    assert report.fmt("num_preemptions", 189.0) == "189"
    assert report.fmt("num_preemptions", 189.5) == "189.5"
    assert report.fmt("ttft_s_p50", 7.281) == "7.28"


def test_a_part_marker_tables_that_part_and_its_8b_twin_only(tmp_path):
    """`results:part-serving` reads the records of parts serving and serving-8b, not the phase's
    other concurrency records in the same file (p14: served p13 and p14 beside in-process ones)."""
    def rec(engine, preset, part, tok_s, **setting):
        r = record("p14_graphs", engine, preset, "concurrency", setting={"concurrency": 64, **setting},
                   samples=[tok_s] * 3, output_tok_s=tok_s, run=part)
        return r | {"part": part}
    served = {"server": "http"}
    write(tmp_path, "p14_graphs/concurrency-h200.json", [
        rec("p13", "llama-1b", "concurrency", 100.0), rec("p14", "llama-1b", "concurrency", 300.0),
        rec("p13", "llama-1b", "serving", 90.0, **served), rec("p14", "llama-1b", "serving", 200.0, **served),
        rec("p13", "llama-8b", "serving-8b", 30.0, **served), rec("p14", "llama-8b", "serving-8b", 60.0, **served)])
    write(tmp_path, "p14_graphs/concurrency-cpu.json", [
        rec("p13", "tiny-llama", "serving", 9.0, **served) | {"device": "cpu"},
        rec("p14", "tiny-llama", "serving", 10.0, **served) | {"device": "cpu"}])
    body = report.build_body("part-serving", "p14_graphs", report.load_records(tmp_path))
    header, one, eight = rows(body)                    # the GPU's table only, where one exists
    assert header.startswith("| model | p13 http | **p14 http** |") and "| p14 |" not in header
    assert one.startswith("| llama-1b (c=64) | 90.0 | 200 |") and one.endswith("| 2.22× (2.22–2.22) |")
    assert eight.startswith("| llama-8b (c=64) | 30.0 | 60.0 |")


def test_profile_table_derives_gpu_idle_and_host_prepare_time(tmp_path):
    """GPU idle is 1 - busy / unprofiled wall; the prepare column is the clocked host stage in µs;
    a CPU profile (no GPU time) shows "–" for idle, not 100%."""
    def prof(device, busy, wall, prepare_ms):
        rec = record("p14_graphs", "p14", "llama-1b", "profile", device=device, gpu_busy_ms=busy,
                     wall_ms_per_step=wall, stage_host_ms={"prepare inputs": prepare_ms})
        return rec | {"setting": {"batch": 1}}
    write(tmp_path, "p14_graphs/profile-h200.json", [prof("NVIDIA H200", 1.2, 1.5, 0.029)])
    write(tmp_path, "p14_graphs/profile-cpu.json", [prof("cpu", 0.0, 0.6, 0.068)])
    records = report.load_records(tmp_path)
    header, row = rows(report.profile_table(records, "p14_graphs", "NVIDIA H200"))
    assert "| GPU idle | host µs to prepare inputs |" in header
    assert "| 1.20 | 20% | 29 |" in row
    _, cpu_row = rows(report.profile_table(records, "p14_graphs", "cpu"))
    assert "| 0.00 | – | 68 |" in cpu_row


def test_profile_pair_table_adds_wall_time_per_kernel(tmp_path):
    """`results:profile-pair`: the step with and without the idea, one row each, with the wall time
    over the kernels launched (the host's cost per launch where the GPU idles)."""
    def prof(graph, wall, kernels):
        rec = record("p14_graphs", "p14", "llama-1b", "profile-pair", gpu_busy_ms=1.0, wall_ms_per_step=wall,
                     kernels_per_step=kernels)
        return rec | {"setting": {"batch": 1, "cuda_graph": graph}}
    write(tmp_path, "p14_graphs/profile-pair-h200.json", [prof(False, 8.0, 160.0), prof(True, 1.6, 160.0)])
    body = report.build_body("profile-pair", "p14_graphs", report.load_records(tmp_path))
    header, eager, graph = rows(body)
    assert header.startswith("| model | batch | cuda_graph | wall ms/step |") and header.endswith("| wall µs / kernel |")
    assert eager.startswith("| llama-1b | 1 | False | 8.00 | 160 | 1.00 | 88% |") and eager.endswith("| 50 |")
    assert graph.endswith("| 10 |")
    assert "with and without the phase's idea" in body
    assert "make phase-14 bench PART=profile-pair" in report.build_body("profile-pair", "p14_graphs", [])


def test_graph_facts_give_the_range_over_the_engines_built(tmp_path):
    """`results:graph-facts`: the graph pool and capture time every engine of the phase's current
    GPU records wrote, as ranges; a CPU's records and engines without graphs are left out."""
    def built(preset, mib, seconds, device="NVIDIA H200"):
        rec = record("p14_graphs", "p14", preset, "latency", device=device, decode_tok_s=1.0)
        return rec | {"engine_facts": {"graph_memory_bytes": mib * 2**20, "capture_seconds": seconds}}
    write(tmp_path, "p14_graphs/latency-h200.json", [
        built("llama-1b", 216, 0.3), built("llama-8b", 284, 6.0),
        record("p14_graphs", "p13", "llama-1b", "latency", decode_tok_s=1.0) | {"engine_facts": {}}])
    write(tmp_path, "p14_graphs/latency-cpu.json", [built("tiny-llama", 9000, 99.0, device="cpu")])
    text = report.build_body("graph-facts", "p14_graphs", report.load_records(tmp_path))
    assert text.startswith("Over the 2 engines built by this phase's current GPU records (llama-1b, llama-8b): "
                           "graph pool 216–284 MiB, warm-up and capture 0.3–6.0 s.")
    assert "latency-cpu.json" not in text


def test_ladder_shows_a_phase_measured_only_as_the_next_phase_baseline(tmp_path):
    """p02 ran only a workload the ladder does not show; p03's run measured p02 beside p03: the
    ladder gives p02 a row from that run, labelled as such, so p03's ratio has its baseline's row."""
    root = make_repo(tmp_path)
    write(root, "p02_next/latency-h200.json", [record("p02_next", "p02", "llama-1b", "shared-prefix", run="run-b",
                                                      ttft_p50_ms=5.0)])
    (root / "results/p02_next/offline-h200.json").unlink()
    write(root, "p03_unwritten/latency-h200.json", [latency("p03_unwritten", "p02", "llama-1b", 200.0, run="run-d"),
                                                    latency("p03_unwritten", "p03", "llama-1b", 400.0, run="run-d")])
    assert report.main(["--root", str(root)]) == 0
    page = rows((root / "results/LADDER.md").read_text())
    assert page[2].startswith("| [p02_next](../phases/p02_next) | p02 (in p03's run) | llama-1b | 200 | 5.00 |")
    assert page[3].startswith("| [p03_unwritten](../phases/p03_unwritten) | p03 | llama-1b | 400 | 2.50 | 40.0% "
                              "| 2.00× (2.00–2.00); no A/A |")


def test_ladder_decode_is_the_standard_batch_1_run_not_a_long_context_one(tmp_path):
    """A long-context part's batch-1 records (prompt_len, a fixed pool) are another regime: the
    ladder's decode column reads the standard batch-1 run, newer long runs notwithstanding; a model
    measured only at long context gets no ladder row."""
    long_run = [record("p05_long", e, p, run="run-long", setting={"batch": 1, "prompt_len": 32768}, decode_tok_s=t,
                       ms_per_token=1e3 / t, floor_bytes=1.0, samples=[t] * 3)
                for e, p, t in [("p05", "llama-1b", 30.0), ("p04", "llama-1b", 10.0), ("p05", "mla-lite", 20.0)]]
    for r in long_run:
        r["provenance"]["utc"] = "2031-01-01T00:00:00+00:00"        # newer than the standard run
    write(tmp_path, "p05_long/latency-h200.json", [latency("p05_long", "p05", "llama-1b", 500.0),
                                                   latency("p05_long", "p04", "llama-1b", 250.0), *long_run])
    ladder = report.ladder(report.load_records(tmp_path))
    assert "| 500 |" in ladder and "2.00× (2.00–2.00)" in ladder
    assert "| 30.0 |" not in ladder and "3.00×" not in ladder and "mla-lite" not in ladder


def test_peer_table_sets_the_peer_beside_our_record_of_its_own_device(tmp_path):
    """A newer run of the phase's engine on another card must not land beside the peer's number
    (an H100 run at 8.7k tok/s once sat beside the peer's H200 19k): ours comes from the peer's device."""
    write(tmp_path, "p14_graphs/latency-h200.json", [latency("p14_graphs", "p14", "llama-1b", 790.0)])
    write(tmp_path, "p14_graphs/peer-h200.json", [latency("p14_graphs", "nano-vllm", "llama-1b", 598.0)])
    newer = latency("p14_graphs", "p14", "llama-1b", 685.0, device="NVIDIA H100 80GB HBM3", run="run-z")
    newer["provenance"] = newer["provenance"] | {"utc": "2031-01-01T00:00:00+00:00"}
    write(tmp_path, "p14_graphs/latency-h100.json", [newer])
    text = report.peer_table(report.load_records(tmp_path), "p14_graphs")
    assert "| llama-1b | latency batch=1 | decode tok/s | 790 " in text
    assert "685" not in text and "latency-h100.json" not in text
