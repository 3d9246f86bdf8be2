"""common.report on synthetic result files in a temporary repository root."""
import json

from common import report

LADDER = "<!-- results:ladder -->\nstale text\n<!-- /results:ladder -->"
BEFORE_AFTER = "<!-- results:before-after -->\n<!-- /results:before-after -->"


def record(phase, engine, preset, workload="latency", device="NVIDIA H200", **metrics):
    return {"phase": phase, "engine": engine, "workload": workload, "preset": preset, "dtype": "bfloat16",
            "scale": "full", "setting": {}, "device": device, "metrics": metrics, "samples": [],
            "provenance": {"git_sha": "0123456789abcdef", "utc": "2030-01-02T03:04:05+00:00", "device": device}}


def latency(phase, engine, preset, tok_s, floor_ms=1.0, **kw):
    return record(phase, engine, preset, decode_tok_s=tok_s, ms_per_token=1e3 / tok_s,
                  roofline_ms_per_token=floor_ms, roofline_frac=floor_ms * tok_s / 1e3, **kw)


def make_repo(tmp_path):
    p01 = [latency("p01_serial", engine, "llama-1b", tok_s)
           for engine, tok_s in [("p01", 100.0), ("hf-generate", 40.0), ("hf-static", 400.0), ("p01", 90.0)]]
    p01.append(latency("p01_serial", "p01", "tiny-llama", 1000.0, device="cpu"))
    p02 = [latency("p02_next", "p02", "llama-1b", 250.0)]
    offline = [record("p02_next", "p02", "llama-1b", "offline", output_tok_s=5000.0, total_tok_s=9000.0)]
    files = {"p01_serial/latency-h200.json": p01[:4], "p01_serial/latency-cpu.json": p01[4:],
             "p02_next/latency-h200.json": p02, "p02_next/offline-h200.json": offline}
    for name, recs in files.items():
        (tmp_path / "results" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "results" / name).write_text(json.dumps(recs))
    for phase in ("p01_serial", "p02_next", "p03_unwritten"):
        (tmp_path / "phases" / phase).mkdir(parents=True)
    (tmp_path / "README.md").write_text(f"# top\n\n{LADDER}\n\nafter\n")
    (tmp_path / "phases/p02_next/README.md").write_text(f"# p02\n{BEFORE_AFTER}\n")
    (tmp_path / "phases/p01_serial/README.md").write_text("# p01 without markers\n")
    return tmp_path


def rows(text):
    return [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]


def test_ladder_values(tmp_path):
    root = make_repo(tmp_path)
    assert report.main(["--root", str(root)]) == 0
    text = (root / "README.md").read_text()
    assert "stale text" not in text and text.endswith("<!-- /results:ladder -->\n\nafter\n")
    h200, cpu = text.split("**cpu**")
    assert rows(h200)[0] == ("| phase | model | decode tok/s | ms/token | % of roofline | vs hf-generate "
                             "| vs hf-static | offline output tok/s |")
    # best p01 record (100 tok/s, not 90), 10 ms/token, floor 1 ms -> 10%, 100/40 and 100/400
    assert rows(h200)[1] == (
        "| [p01_serial](phases/p01_serial) | llama-1b | 100 | 10.00 | 10.0% | 2.50× | 0.25× | – |")
    # p02 has no HF run of its own: the peers come from p01's run on the same device and model
    assert rows(h200)[2] == (
        "| [p02_next](phases/p02_next) | llama-1b | 250 | 4.00 | 25.0% | 6.25× | 0.62× | 5,000 |")
    assert "`results/p01_serial/latency-h200.json` (git 0123456, 2030-01-02 UTC, NVIDIA H200)" in h200
    assert "**NVIDIA H200**" in h200
    assert rows(cpu)[1].startswith("| [p01_serial](phases/p01_serial) | tiny-llama | 1,000 |")


def test_before_after_values(tmp_path):
    root = make_repo(tmp_path)
    report.main(["--root", str(root)])
    text = (root / "phases/p02_next/README.md").read_text()
    latency_table, offline_table = text.split("offline throughput")
    # the previous phase's numbers come from its own folder; no HF run here, so no HF columns
    assert rows(latency_table) == [
        "| model | p01 | **p02** | p02 ms/token | p02 % of roofline | p02 vs p01 |",
        "| llama-1b | 100 | 250 | 4.00 | 25.0% | 2.50× |"]
    assert rows(offline_table) == ["| model | **p02** | p02 total tok/s |", "| llama-1b | 5,000 | 9,000 |"]
    assert "_Source: `results/p01_serial/latency-h200.json`" in latency_table
    assert "`results/p02_next/offline-h200.json` (git 0123456, 2030-01-02 UTC, NVIDIA H200)" in offline_table
    assert (root / "phases/p01_serial/README.md").read_text() == "# p01 without markers\n"


def test_idempotent_and_check(tmp_path, capsys):
    root = make_repo(tmp_path)
    assert report.main(["--root", str(root), "--check"]) == 1      # fresh markers are stale
    assert "stale text" in (root / "README.md").read_text()          # --check writes nothing
    report.main(["--root", str(root)])
    first = {p: p.read_text() for p in root.rglob("README.md")}
    assert report.main(["--root", str(root)]) == 0
    assert {p: p.read_text() for p in root.rglob("README.md")} == first
    assert report.main(["--root", str(root), "--check"]) == 0
    newer = [latency("p02_next", "p02", "llama-1b", 300.0)]
    (root / "results/p02_next/latency-h200.json").write_text(json.dumps(newer))
    assert report.main(["--root", str(root), "--check"]) == 1
    assert "README.md" in capsys.readouterr().out


def test_unknown_marker_and_no_results(tmp_path):
    (tmp_path / "phases/p05_x").mkdir(parents=True)
    odd = "<!-- results:nonsense -->\nkeep\n<!-- /results:nonsense -->"
    (tmp_path / "phases/p05_x/README.md").write_text(f"{odd}\n{BEFORE_AFTER}\n")
    (tmp_path / "README.md").write_text(LADDER)
    assert report.main(["--root", str(tmp_path)]) == 0
    text = (tmp_path / "phases/p05_x/README.md").read_text()
    assert odd in text and "No results yet: run `make phase-05 bench`" in text
    assert "No results yet" in (tmp_path / "README.md").read_text()


def test_concurrency_rows_in_numeric_order(tmp_path):
    """One row per concurrency level (8 before 32), previous phase and peer side by side."""
    def conc(engine, c, tok_s):
        rec = record("p02_next", engine, "llama-1b", "concurrency", output_tok_s=tok_s, itl_ms_p50=1e3 / tok_s * c)
        return rec | {"setting": {"concurrency": c}}
    recs = [conc(e, c, t * c) for c in (32, 8) for e, t in [("p01", 10.0), ("p02", 50.0), ("hf-generate", 20.0)]]
    (tmp_path / "results/p02_next").mkdir(parents=True)
    (tmp_path / "results/p02_next/concurrency-h200.json").write_text(json.dumps(recs))
    (tmp_path / "phases/p02_next").mkdir(parents=True)
    (tmp_path / "phases/p02_next/README.md").write_text(BEFORE_AFTER)
    report.main(["--root", str(tmp_path)])
    text = (tmp_path / "phases/p02_next/README.md").read_text()
    assert "throughput at fixed concurrency" in text
    assert rows(text) == [
        "| model | p01 | **p02** | hf-generate | p02 ms/step (ITL p50) | p02 vs p01 | p02 vs hf-generate |",
        "| llama-1b (c=8) | 80.0 | 400 | 160 | 20.00 | 5.00× | 2.50× |",
        "| llama-1b (c=32) | 320 | 1,600 | 640 | 20.00 | 5.00× | 2.50× |"]


def test_parallel_modes_are_columns_of_their_own(tmp_path):
    """A phase that runs its engine in two parallel modes gets one bold column and one ratio per mode."""
    recs = [latency("p04_par", "p03", "llama-1b", 100.0)]
    for mode, tok_s in [("replica", 190.0), ("pipeline", 80.0)]:
        rec = latency("p04_par", "p04", "llama-1b", tok_s)
        rec["setting"] = {"batch": 1, "parallel": mode, "world_size": 2}
        recs.append(rec)
    (tmp_path / "results/p04_par").mkdir(parents=True)
    (tmp_path / "results/p04_par/latency-h200.json").write_text(json.dumps(recs))
    table = report.before_after(report.load_records(tmp_path), "p04_par", "NVIDIA H200", "latency")
    header, row = rows(table)
    assert "**p04 pipeline**" in header and "**p04 replica**" in header
    assert "p04 replica vs p03" in header and "p04 pipeline vs p03" in header
    assert "| 1.90× |" in row and "| 0.80× |" in row


def test_profile_rows_per_batch_and_setting(tmp_path):
    """One row per (batch, engine option), batches in numeric order; the marker fills the README."""
    def prof(batch, lean, wall, kernels):
        rec = record("p05_prof", "p05", "llama-1b", "profile", wall_ms_per_step=wall, kernels_per_step=kernels,
                     gpu_busy_ms=2.0, syncs_per_step=7.0, ideal_ms_per_step=0.5, roofline_frac=0.5 / wall)
        return rec | {"setting": {"lean_step": lean, "batch": batch}}
    recs = [prof(b, lean, w, k) for b, lean, w, k in [(64, 0, 12.0, 568.0), (1, 1, 8.0, 414.0), (1, 0, 10.0, 558.0)]]
    (tmp_path / "results/p05_prof").mkdir(parents=True)
    (tmp_path / "results/p05_prof/profile-h200.json").write_text(json.dumps(recs))
    (tmp_path / "phases/p05_prof").mkdir(parents=True)
    (tmp_path / "phases/p05_prof/README.md").write_text("<!-- results:profile -->\n<!-- /results:profile -->\n")
    report.main(["--root", str(tmp_path)])
    text = (tmp_path / "phases/p05_prof/README.md").read_text()
    assert rows(text) == [
        "| model | batch | lean_step | wall ms/step | kernels/step | GPU busy ms | syncs/step | floor ms "
        "| % of roofline |",
        "| llama-1b | 1 | 0 | 10.00 | 558 | 2.00 | 7 | 0.500 | 5.0% |",
        "| llama-1b | 1 | 1 | 8.00 | 414 | 2.00 | 7 | 0.500 | 6.2% |",
        "| llama-1b | 64 | 0 | 12.00 | 568 | 2.00 | 7 | 0.500 | 4.2% |"]
    assert "`results/p05_prof/profile-h200.json` (git 0123456" in text
    assert report.profile_all([], "p05_prof").startswith("_No profile yet: run `make phase-05 profile`")


def test_ladder_throughput_at_the_top_concurrency_and_no_empty_rows(tmp_path):
    """The ladder's last column is each phase's own output tok/s at the highest concurrency
    measured; a phase with only other workloads (a gather or profile run) gets no row."""
    root = make_repo(tmp_path)
    conc = [record("p02_next", "p02", "llama-1b", "concurrency", output_tok_s=t) | {"setting": {"concurrency": c}}
            for c, t in [(8, 800.0), (64, 6400.0)]]
    gather = [record("p03_unwritten", "p03", "llama-1b", "gather", step_ms=1.0)]
    (root / "results/p02_next/concurrency-h200.json").write_text(json.dumps(conc))
    (root / "results/p03_unwritten").mkdir(parents=True)
    (root / "results/p03_unwritten/gather-h200.json").write_text(json.dumps(gather))
    report.main(["--root", str(root)])
    h200 = (root / "README.md").read_text().split("**cpu**")[0]
    assert rows(h200)[0].endswith("| offline output tok/s | output tok/s at c=64 |")
    assert rows(h200)[2].endswith("| 5,000 | 6,400 |")
    assert "p03_unwritten" not in h200


def test_offline_sizes_are_rows_and_the_ladder_takes_the_standard_one(tmp_path):
    """An offline run at another size (setting "requests") is a row of its own, after the standard
    one; the ladder's offline column only takes standard-size runs."""
    recs = []
    for requests, scale in [(1024, 2.0), (None, 1.0)]:
        for engine, tok_s in [("p03", 100.0), ("p04", 150.0 * scale)]:
            rec = record("p04_par", engine, "llama-1b", "offline", output_tok_s=tok_s * scale, total_tok_s=1.0)
            rec["setting"] = {"requests": requests} if requests else {}
            recs.append(rec)
    (tmp_path / "results/p04_par").mkdir(parents=True)
    (tmp_path / "results/p04_par/offline-h200.json").write_text(json.dumps(recs))
    records = report.load_records(tmp_path)
    _, standard, large = rows(report.before_after(records, "p04_par", "NVIDIA H200", "offline"))
    assert standard.startswith("| llama-1b | 100 | 150 |") and standard.endswith("| 1.50× |")
    assert large.startswith("| llama-1b (1024 requests) | 200 | 600 |") and large.endswith("| 3.00× |")
    assert "| 150 |" in report.ladder(records) and "600" not in report.ladder(records)


def test_engine_options_are_columns_of_their_own(tmp_path):
    """p05 with lean_step=0 is its own bold column beside p05, not hidden by best-of."""
    recs = [latency("p05_prof", "p04", "llama-1b", 100.0), latency("p05_prof", "p05", "llama-1b", 120.0)]
    off = latency("p05_prof", "p05", "llama-1b", 101.0)
    off["setting"] = {"batch": 1, "lean_step": 0}
    (tmp_path / "results/p05_prof").mkdir(parents=True)
    (tmp_path / "results/p05_prof/latency-h200.json").write_text(json.dumps(recs + [off]))
    header, row = rows(report.before_after(report.load_records(tmp_path), "p05_prof", "NVIDIA H200", "latency"))
    assert "**p05**" in header and "**p05 lean_step=0**" in header
    assert "| 1.20× | 1.01× |" in row
