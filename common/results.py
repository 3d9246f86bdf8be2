"""Result files: lists of records with provenance, and reading them back."""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


def git_sha() -> str:
    """The commit measured; MINI_INFER_GIT_SHA overrides it where the tree has no .git."""
    if os.environ.get("MINI_INFER_GIT_SHA"):
        return os.environ["MINI_INFER_GIT_SHA"]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "common", "phases"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:   # noqa: BLE001 - a missing optional package is just "None"
        return None


def provenance(device_name: str) -> dict:
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "git_sha": git_sha(), "device": device_name, "host_cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(), "torch": torch.__version__, "triton": _version("triton"),
        "transformers": _version("transformers"), "cuda": torch.version.cuda,
        "utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def device_tag(device_name: str) -> str:
    """File-name tag for a device: its model number, lower case ("NVIDIA H200" -> "h200",
    "NVIDIA H100 80GB HBM3" -> "h100"); "cpu" -> "cpu"; a name without one -> its last word."""
    model = re.search(r"\b[A-Z]{1,2}\d{2,4}\b", device_name)
    return (model.group(0) if model else device_name.split()[-1]).lower()


def trace_name(device_name: str, model: str, batch: int) -> str:
    """A profile trace's file name: "trace-h200-llama-8b-b1.json.gz" (a model path's "/" becomes "_",
    so two models profiled into one folder keep their own traces)."""
    return f"trace-{device_tag(device_name)}-{re.sub(r'[^A-Za-z0-9._-]', '_', model)}-b{batch}.json.gz"


def record_key(rec: dict) -> str:
    """Records with the same key measure the same thing; a new one replaces the old."""
    return json.dumps([rec["engine"], *_slot(rec)], sort_keys=True)


# Setting keys that some records carry about how their run went, not about what it was asked to
# measure (p13's scripted proposer recorded them there once): not part of what a record measures.
RUN_NOTES = ("script_fidelity", "script_replayed")


def _slot(rec: dict) -> list:
    setting = {k: v for k, v in rec["setting"].items() if k not in RUN_NOTES}
    return [rec["workload"], rec["preset"], rec["dtype"], rec["scale"], rec["device"], setting]


def part_slot(rec: dict) -> str | None:
    """One bench part's measurement at one setting, whichever engines ran it (None without a part).
    A new run of the part replaces every engine's record there: an engine the part no longer runs
    (a relabelled or dropped one) must not sit in a table beside the new run as if measured with it."""
    return json.dumps([rec["part"], *_slot(rec)], sort_keys=True) if rec.get("part") else None


def history_path(path: Path) -> Path:
    """Where the records that `path` no longer holds go: results/<phase>/history/<same name>."""
    return path.parent / "history" / path.name


def read_list(path: Path) -> list:
    """The records a result file holds ([] when there is none). A file that is not readable JSON
    (an interrupted write before writes were atomic left one empty) is moved aside, loudly, and
    counts as empty: a bench run never dies on it, and its bytes stay for a look."""
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        print(f"[results] WARNING: {path} is not readable JSON ({e}); moved it to {move_aside(path)}",
              file=sys.stderr, flush=True)
        return []
    if not isinstance(data, list):
        raise ValueError(f"{path} holds JSON that is not a list of records; move it away")
    return data


def move_aside(path: Path) -> Path:
    """Rename an unreadable result file to <name>.corrupt-<UTC time> (not *.json: no reader picks it up)."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    path.replace(target)
    return target


def refresh(path: Path, text: str, check: bool) -> bool:
    """Whether the generated `text` differs from the file at `path` (missing counts as differing);
    writes it unless `check` (report and runs: `--check` says what is stale and writes nothing)."""
    stale = not path.is_file() or path.read_text() != text
    if stale and not check:
        path.write_text(text)
    return stale


def fill_readme_blocks(phase: str, tag: str, texts: dict[str, str], check: bool = False) -> bool:
    """Rewrite the generated blocks of phases/<phase>/README.md, each between
    `<!-- tag:name -->` and `<!-- /tag:name -->`, with texts[name]; whether any was stale."""
    path = ROOT / "phases" / phase / "README.md"
    block = re.compile(rf"(<!-- {re.escape(tag)}:(\w+) -->\n)(.*?)(<!-- /{re.escape(tag)}:\2 -->)", re.S)
    return refresh(path, block.sub(lambda m: m.group(1) + texts[m.group(2)] + "\n" + m.group(4), path.read_text()), check)


def write_json(path: Path, data) -> None:
    """Write atomically: a temporary file in the same folder, then os.replace() over `path`. An
    interrupt leaves either the old file or the new one, never a truncated one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.chmod(tmp, 0o644)                       # mkstemp's 0600 would follow the file into the checkout
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sweep_time(record: dict) -> str | None:
    """When the process that wrote a run-less record started (its provenance's time)."""
    return (record.get("provenance") or {}).get("utc")


def write_records(path: Path, records: list[dict], sweep: bool = False) -> None:
    """Merge `records` into the file at `path`, replacing records with the same key.

    The result file holds each measurement's newest run. A record replaced by one of another run
    (same key, or same part and setting: part_slot) is appended to history_path(path), so a re-run
    keeps the runs before it (how far a ratio moves from run to run is itself a result). A record
    rewritten within its own run (common.bench writes after every round) is simply replaced.

    sweep=True (the kernel scripts: records without a run id, one provenance for the process): the
    sweep is one run, so the file's records of its workloads from an earlier sweep (another
    provenance time) go to history whole, even where this sweep timed other settings (a split
    count the rule no longer picks): a file never holds rows of two sweeps side by side."""
    path.parent.mkdir(parents=True, exist_ok=True)
    old = read_list(path)
    new_runs = {record_key(r): r.get("run_id") for r in records}
    new_slots = {part_slot(r): r.get("run_id") for r in records if part_slot(r) and r.get("run_id")}
    sweeps = {(r.get("workload"), sweep_time(r)) for r in records if sweep and not r.get("run_id")}
    swept = {workload for workload, _ in sweeps}

    def replaced(r: dict) -> bool:           # by a record of another run: kept in history
        if not r.get("run_id"):
            return r.get("workload") in swept and (r.get("workload"), sweep_time(r)) not in sweeps
        return (new_runs.get(record_key(r)) not in (None, r["run_id"])
                or new_slots.get(part_slot(r)) not in (None, r["run_id"]))
    superseded = [r for r in old if replaced(r)]
    if superseded:
        archive = history_path(path)
        archive.parent.mkdir(exist_ok=True)
        write_json(archive, read_list(archive) + superseded)
    write_json(path, [r for r in old if record_key(r) not in new_runs and not replaced(r)] + records)


def read_records(phase: str | None = None) -> list[dict]:
    """Every record under results/ (or one phase's folder)."""
    folders = [RESULTS / phase] if phase else sorted(p for p in RESULTS.iterdir() if p.is_dir())
    records = []
    for folder in folders:
        for file in sorted(folder.glob("*.json")):
            for rec in json.loads(file.read_text()):
                records.append(rec | {"file": str(file.relative_to(ROOT))})
    return records
