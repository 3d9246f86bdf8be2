"""common.results.write_records: the newest run per measurement, earlier runs kept in history/."""
import json

from common import report
from common.results import history_path, write_records


def rec(run_id, tok_s, engine="p02", concurrency=64):
    return {"phase": "p02_next", "engine": engine, "workload": "concurrency", "preset": "llama-1b",
            "dtype": "bfloat16", "scale": "full", "device": "NVIDIA H200", "setting": {"concurrency": concurrency},
            "run_id": run_id, "metrics": {"output_tok_s": tok_s}}


def read(path):
    return json.loads(path.read_text()) if path.exists() else []


def test_a_record_replaced_by_another_run_moves_to_history(tmp_path):
    path = tmp_path / "results" / "p02_next" / "concurrency-h200.json"
    write_records(path, [rec("run-a", 100.0), rec("run-a", 50.0, concurrency=8)])
    write_records(path, [rec("run-b", 120.0)])
    assert sorted((r["run_id"], r["setting"]["concurrency"]) for r in read(path)) == [("run-a", 8), ("run-b", 64)]
    assert history_path(path) == tmp_path / "results" / "p02_next" / "history" / "concurrency-h200.json"
    assert [(r["run_id"], r["metrics"]["output_tok_s"]) for r in read(history_path(path))] == [("run-a", 100.0)]
    write_records(path, [rec("run-c", 130.0)])                  # history grows, oldest first
    assert [r["run_id"] for r in read(history_path(path))] == ["run-a", "run-b"]


def test_a_record_rewritten_within_its_own_run_is_not_history(tmp_path):
    """common.bench rewrites its records after every round: those rounds are one run."""
    path = tmp_path / "concurrency-h200.json"
    for tok_s in (100.0, 110.0, 120.0):
        write_records(path, [rec("run-a", tok_s)])
    assert [r["metrics"]["output_tok_s"] for r in read(path)] == [120.0]
    assert not history_path(path).exists()


def test_records_without_a_run_id_are_simply_replaced(tmp_path):
    path = tmp_path / "kernel-h200.json"
    write_records(path, [rec(None, 1.0)])
    write_records(path, [rec(None, 2.0)])
    assert [r["metrics"]["output_tok_s"] for r in read(path)] == [2.0]
    assert not history_path(path).exists()


def test_a_sweep_rerun_moves_the_whole_earlier_sweep_to_history(tmp_path):
    """Kernel sweeps carry no run id: a re-run that times other settings (a split count the rule no
    longer picks) must not leave the earlier sweep's other rows current beside its own."""
    path = tmp_path / "kernel-h200.json"

    def swept(utc, splits, us, workload="kernel"):
        return rec(None, us, concurrency=splits) | {"workload": workload, "provenance": {"utc": utc}}
    write_records(path, [swept("t1", 32, 1.0), swept("t1", 64, 2.0), swept("t1", 0, 0.0, "kernel-check")], sweep=True)
    write_records(path, [swept("t1", 32, 1.5)], sweep=True)      # the same sweep writing again: no history
    assert not history_path(path).exists()
    write_records(path, [swept("t2", 128, 3.0)], sweep=True)
    assert [(r["setting"]["concurrency"], r["provenance"]["utc"]) for r in read(path)] == [(0, "t1"), (128, "t2")]
    assert sorted(r["setting"]["concurrency"] for r in read(history_path(path))) == [32, 64]


def test_tables_read_the_newest_run_only(tmp_path):
    path = tmp_path / "results" / "p02_next" / "concurrency-h200.json"
    write_records(path, [rec("run-a", 100.0)])
    write_records(path, [rec("run-b", 120.0)])
    assert [r["run_id"] for r in report.load_records(tmp_path)] == ["run-b"]
    assert [r["run_id"] for r in report.load_history(tmp_path)] == ["run-a"]


def test_writes_are_atomic_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    """write_records writes a temporary file beside the target and renames it over: an interrupt
    in the middle (here: json.dumps raising) leaves the old file whole and no temporary behind."""
    import common.results as results
    path = tmp_path / "concurrency-h200.json"
    write_records(path, [rec("run-a", 100.0)])

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(results.json, "dumps", interrupted)
    try:
        write_records(path, [rec("run-a", 200.0)])
    except KeyboardInterrupt:
        pass
    monkeypatch.undo()
    assert [r["metrics"]["output_tok_s"] for r in read(path)] == [100.0]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_corrupt_result_file_is_moved_aside_not_fatal(tmp_path, capsys):
    """An empty or cut-short file (left by an interrupted write before writes were atomic): the
    next write moves it to <name>.corrupt-<time>, says so on stderr, and writes its records."""
    path = tmp_path / "concurrency-h200.json"
    path.write_text("")
    write_records(path, [rec("run-a", 100.0)])
    assert [r["run_id"] for r in read(path)] == ["run-a"]
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith(path.name + ".corrupt-")]
    assert aside.read_text() == "" and "not readable JSON" in capsys.readouterr().err


def test_a_new_run_of_a_part_replaces_engines_it_no_longer_runs(tmp_path):
    """A part re-run with a relabelled engine ("p07" became "p07 attention_backend=triton"): the old
    label's record goes to history instead of sitting in the table beside the new run."""
    path = tmp_path / "concurrency-h200.json"
    ladder = {"part": "ladder"}
    write_records(path, [rec("run-a", 100.0) | ladder, rec("run-a", 90.0, engine="p07") | ladder])
    write_records(path, [rec("run-b", 120.0) | ladder, rec("run-b", 95.0, engine="p07 triton") | ladder])
    assert sorted((r["engine"], r["run_id"]) for r in read(path)) == [("p02", "run-b"), ("p07 triton", "run-b")]
    assert sorted(r["engine"] for r in read(history_path(path))) == ["p02", "p07"]


def test_a_part_leaves_other_parts_and_settings_alone(tmp_path):
    """Another part in the same file, or the same part at another setting (p10's aa-noise runs
    noise control off and on as two runs), stays current."""
    path = tmp_path / "concurrency-h200.json"
    write_records(path, [rec("run-a", 100.0) | {"part": "concurrency"},
                         rec("run-a", 80.0, concurrency=8) | {"part": "a"}])
    write_records(path, [rec("run-b", 120.0, engine="p03") | {"part": "long"}])
    write_records(path, [rec("run-c", 70.0, engine="p03", concurrency=8) | {"part": "b"}])
    assert sorted(r["run_id"] for r in read(path)) == ["run-a", "run-a", "run-b", "run-c"]
    assert not history_path(path).exists()


def test_a_run_note_in_the_setting_does_not_make_another_measurement(tmp_path):
    """p13's speed records once carried how their script replayed in the setting: a later run of
    the same part and asked setting replaces them all the same."""
    path = tmp_path / "speed-h200.json"
    noted = rec("run-a", 100.0) | {"part": "speed-16"}
    noted["setting"] = noted["setting"] | {"script_fidelity": 0.9}
    write_records(path, [noted])
    write_records(path, [rec("run-b", 120.0) | {"part": "speed-16"}])
    assert [r["run_id"] for r in read(path)] == ["run-b"]
    assert [r["run_id"] for r in read(history_path(path))] == ["run-a"]


def test_trace_name_keeps_two_models_apart():
    from common.results import trace_name
    assert trace_name("NVIDIA H200", "llama-8b", 1) == "trace-h200-llama-8b-b1.json.gz"
    assert trace_name("cpu", "org/some model", 64) == "trace-cpu-org_some_model-b64.json.gz"
    assert trace_name("cpu", "llama-1b", 1) != trace_name("cpu", "llama-8b", 1)
