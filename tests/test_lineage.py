"""Phase lineage: each phase differs from the one before it by the files its CHANGES lists.

Every other file must be byte-identical to the previous phase's copy, and the diff is capped so
one phase never smuggles in two ideas. Engine files never name their phase (relative imports
only), so an untouched file stays identical when it is copied forward.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

PHASES = sorted(p for p in (Path(__file__).resolve().parent.parent / "phases").iterdir()
                if p.is_dir() and re.fullmatch(r"p\d\d_\w+", p.name))
NOT_ENGINE = {"README.md", "CHANGES"}
TOOLING = ("bench.py", "kernel_bench.py")   # the phase's scripts: `make diff-NN` shows them after the engine
MAX_DIFF_LINES = 500            # added + removed lines, engine files only
# Phases whose one idea needs a larger diff, with the reason.
DIFF_CAP_EXCEPTIONS: dict[str, int] = {
    "p02_paged_kv": 650,   # block manager + scheduler + model runner are one idea (continuous batching over paged KV),
                           # and its bench set adds the KV-gather measurement
    "p04_replica_pipeline": 830,   # spreading the engine over processes is mostly multi-process plumbing (forkserver, queues,
                                   # send/recv) and its fault handling (call ids, aborts, workers that die with the parent,
                                   # a refused request named by its index)
    "p09_http_serving": 1150,   # a server is its own layer: the engine loop's process and its queues, OpenAI's
                                # protocol and errors, SSE streaming with disconnects, Prometheus metrics
    "p13_speculative_decoding": 570,   # speculation keeps state per request (drafts in flight, a draft model's own
                                       # pool): recovery after a failure and the accounting check cover it too
    "p14_cuda_graphs": 740,   # once a graph removes the launches, a step costs its kernels: the graphs beat the peer's
                              # only with the small neighbours fused (rotary + K/V store, residual add + norm, SiLU * mul),
                              # switchable so one run splits the gain between graphs and fusion;
                              # and p13's verify replays too (its rows as decode lanes), or graphs erase its gain
    "p15_flash_decoding": 520,   # the decode kernel is rewritten whole (a split kernel and a combine), and the bench set
                                 # is replaced by long-context parts and the kernel sweep (p14's parts measured p14's idea)
    "p16_tensor_parallel": 1500,   # ~840 of them deleted: p04's replica and pipeline process layer leaves, replaced
                                   # by the ranks' own (sharding, process groups, the mailbox, faults)
    "p17_mla": 660,   # a second attention (the latent one) beside GQA, with its own kernel and kernel sweep,
                      # and the combine sliced over dims (a 512-wide latent head at 256 splits)
    "p18_pd_disaggregation": 870,   # a second engine in its own process: the pair's start and mailboxes, the KV
                                    # connector (send/recv and CUDA IPC), aborts and a failed prefill instance on both sides
    "p19_quantization": 1140,   # the engine's part is ~520 (the 8-bit Linear, its kernels and the fused quantizers,
                                # smoothing, loading); the rest is tooling that replaces p18's bench set and p17's
                                # latent kernel bench (their deleted lines count too) with the GEMM sweep and accuracy
}


def engine_files(phase: Path) -> dict[str, Path]:
    return {str(f.relative_to(phase)): f for f in sorted(phase.rglob("*"))
            if f.is_file() and f.name not in NOT_ENGINE and "__pycache__" not in f.parts}


def parse_changes(phase: Path) -> dict[str, str]:
    """CHANGES lines "A|M|D path" -> {path: letter}; '#' starts a comment."""
    changes = {}
    for line in (phase / "CHANGES").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            kind, path = line.split(maxsplit=1)
            assert kind in "AMD" and len(kind) == 1, f"{phase.name}/CHANGES: bad line {line!r}"
            changes[path] = kind
    return changes


def changed_lines(a: Path | None, b: Path | None) -> int:
    """Added + removed lines between two versions of a file (None: absent), counted on GNU diff's
    output, the same program `make diff-NN` runs, so both counts agree line for line."""
    out = subprocess.run(["diff", "-u", str(a or os.devnull), str(b or os.devnull)],
                         capture_output=True, text=True).stdout.splitlines()
    return count_changes(out)


def count_changes(diff_lines: list[str]) -> int:
    """+/- lines of unified diff output, headers (---/+++ before each file's first hunk) excluded."""
    count, in_hunk = 0, False
    for line in diff_lines:
        if line.startswith("@@"):
            in_hunk = True
        elif line.startswith("diff ") or (not in_hunk and line[:3] in ("---", "+++")):
            in_hunk = False
        elif in_hunk and line[:1] in "+-":
            count += 1
    return count


def test_phases_exist_and_first_has_no_changes():
    assert PHASES and PHASES[0].name.startswith("p01_")
    assert parse_changes(PHASES[0]) == {}
    numbers = [int(p.name[1:3]) for p in PHASES]
    assert numbers == list(range(1, len(PHASES) + 1)), f"phase numbers must be contiguous: {numbers}"


@pytest.mark.parametrize("phase", PHASES, ids=lambda p: p.name)
def test_engine_files_do_not_name_their_phase(phase):
    for name, f in engine_files(phase).items():
        if f.suffix == ".py":
            text = f.read_text()
            assert not re.search(r"\bp\d\d_[a-z]", text), f"{phase.name}/{name} names a phase folder"
            assert not re.search(r"from phases\b|import phases\b", text), f"{phase.name}/{name}: use relative imports"


@pytest.mark.parametrize("prev,cur", list(zip(PHASES, PHASES[1:])), ids=lambda p: p.name)
def test_changes_manifest_is_true(prev, cur):
    changes, old, new = parse_changes(cur), engine_files(prev), engine_files(cur)
    for path in sorted(set(old) | set(new)):
        kind = changes.get(path)
        if kind is None:
            assert path in old and path in new, f"{cur.name}: {path} added or deleted but not in CHANGES"
            assert old[path].read_bytes() == new[path].read_bytes(), \
                f"{cur.name}: {path} differs from {prev.name} but CHANGES does not list it"
        elif kind == "A":
            assert path in new and path not in old, f"{cur.name}/CHANGES: 'A {path}' but it is not new"
        elif kind == "D":
            assert path in old and path not in new, f"{cur.name}/CHANGES: 'D {path}' but it was not deleted"
        else:
            assert path in old and path in new and old[path].read_bytes() != new[path].read_bytes(), \
                f"{cur.name}/CHANGES: 'M {path}' but it is unchanged or missing"
    stale = set(changes) - set(old) - set(new)
    assert not stale, f"{cur.name}/CHANGES lists files in neither phase: {sorted(stale)}"


@pytest.mark.parametrize("prev,cur", list(zip(PHASES, PHASES[1:])), ids=lambda p: p.name)
def test_diff_is_one_idea_small(prev, cur):
    old, new = engine_files(prev), engine_files(cur)
    engine = (set(old) | set(new)) - set(TOOLING)         # the lesson's lines, not its scripts'
    total = sum(changed_lines(old.get(p), new.get(p)) for p in engine)
    cap = DIFF_CAP_EXCEPTIONS.get(cur.name, MAX_DIFF_LINES)
    assert total <= cap, f"{cur.name} changes {total} lines vs {prev.name} (cap {cap})"


def diff_counts(prev: Path, cur: Path) -> tuple[int, int]:
    """(engine lines, tooling lines) changed from prev to cur: the two numbers `make diff-NN`'s
    header line gives."""
    old, new = engine_files(prev), engine_files(cur)
    counts = {p: changed_lines(old.get(p), new.get(p)) for p in set(old) | set(new)}
    tooling = sum(n for p, n in counts.items() if Path(p).name in TOOLING)
    return sum(counts.values()) - tooling, tooling


@pytest.mark.parametrize("prev,cur", list(zip(PHASES, PHASES[1:])), ids=lambda p: p.name)
def test_make_diff_shows_every_counted_line(prev, cur):
    """`make diff-NN` is what a reader studies: added and deleted files appear in full, so the
    changed lines it prints are exactly the lines this test file counts; the engine's files come
    first, in the order the phase's CHANGES lists them (its core file first), the tooling after
    them, and the header line gives both counts."""
    root = PHASES[0].parent.parent
    out = subprocess.run(["make", "-s", "--no-print-directory", f"diff-{cur.name[1:3]}"], cwd=root,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    engine, tooling = diff_counts(prev, cur)
    assert out[0] == (f"{cur.name} vs {prev.name}: {engine} engine lines changed; "
                      f"its tooling after them ({' '.join(TOOLING)}): {tooling} lines")
    assert not any(line.startswith("Only in") for line in out)
    assert count_changes(out) == engine + tooling
    files = [Path(line.split()[-1]).name for line in out if line.startswith("diff ")]
    is_tooling = [name in TOOLING for name in files]
    assert is_tooling == sorted(is_tooling), f"tooling shown before engine files: {files}"
    listed = [path for path in parse_changes(cur) if Path(path).name not in TOOLING]
    assert files[:len(listed)] == [Path(path).name for path in listed], f"not in CHANGES order: {files}"
