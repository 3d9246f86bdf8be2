"""Result files: lists of records with provenance (DESIGN section 6), and reading them back."""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
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
    """File-name tag for a device: "NVIDIA H200" -> "h200", "cpu" -> "cpu"."""
    return device_name.split()[-1].lower() if device_name != "cpu" else "cpu"


def record_key(rec: dict) -> str:
    """Records with the same key measure the same thing; a new one replaces the old."""
    return json.dumps([rec["engine"], rec["workload"], rec["preset"], rec["dtype"], rec["scale"],
                       rec["device"], rec["setting"]], sort_keys=True)


def history_path(path: Path) -> Path:
    """Where the records that `path` no longer holds go: results/<phase>/history/<same name>."""
    return path.parent / "history" / path.name


def write_records(path: Path, records: list[dict]) -> None:
    """Merge `records` into the file at `path`, replacing records with the same key.

    The result file holds each measurement's newest run. A record replaced by one of another run
    is appended to history_path(path), so a re-run keeps the runs before it (how far a ratio moves
    from run to run is itself a result). A record rewritten within its own run (common.bench
    writes after every round) or without a run id is simply replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(path.read_text()) if path.exists() else []
    new_runs = {record_key(r): r.get("run_id") for r in records}
    superseded = [r for r in old if r.get("run_id") and new_runs.get(record_key(r)) not in (None, r["run_id"])]
    if superseded:
        archive = history_path(path)
        archive.parent.mkdir(exist_ok=True)
        kept = json.loads(archive.read_text()) if archive.exists() else []
        archive.write_text(json.dumps(kept + superseded, indent=1) + "\n")
    merged = [r for r in old if record_key(r) not in new_runs] + records
    path.write_text(json.dumps(merged, indent=1) + "\n")


def read_records(phase: str | None = None) -> list[dict]:
    """Every record under results/ (or one phase's folder)."""
    folders = [RESULTS / phase] if phase else sorted(p for p in RESULTS.iterdir() if p.is_dir())
    records = []
    for folder in folders:
        for file in sorted(folder.glob("*.json")):
            for rec in json.loads(file.read_text()):
                records.append(rec | {"file": str(file.relative_to(ROOT))})
    return records
