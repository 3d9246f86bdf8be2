"""Every notebook runs headless, top to bottom, against the committed results/ (common.notebooks)."""
import hashlib
import re
import shutil

import nbformat
import pytest

from common import notebooks
from tests import selection

NOTEBOOKS = sorted(notebooks.NOTEBOOKS.glob("*.ipynb"))
MEASURED = re.compile(r"\d[\d,.]*\s*(tok/s|ms|s\b|%|GiB|GB/s|×|x\b)")


# Where a notebook that executed cleanly leaves the digest of what it ran on (ignored by git;
# `make clean` removes it).
STAMPS = notebooks.ROOT / ".pytest_cache" / "notebooks"


def inputs_digest(path) -> str:
    """What a notebook's run depends on: the notebook, every file under results/ (a review
    notebook reads other phases' records), the common/ code it calls, and the pinned stack."""
    root, digest = notebooks.ROOT, hashlib.sha256()
    inputs = [path, root / "requirements.txt", *sorted((root / "common").glob("*.py")),
              *sorted(f for f in (root / "results").rglob("*") if f.is_file())]
    for f in inputs:
        digest.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch, request):
    """Run a copy (the committed notebook keeps its stored outputs); cwd is the repo root, and its
    figures go to tmp_path (the committed PNGs stay as the last deliberate run left them).

    A notebook runs once per change of what it runs on (inputs_digest): after a clean run its
    digest is stamped under .pytest_cache/, and `make test` skips it (saying so) while the digest
    is the same; `make test-all` runs it regardless. A fresh clone (CI) has no stamps, so it runs
    every notebook: measured at 3d7514a + this change, the ten notebooks take about 75 s of CPU
    (a kernel start, the imports and the figures each; 4.4 min wall on 2 cores shared with other
    jobs), which a fresh clone can afford; a developer's repeated `make test` need not pay it."""
    digest, stamp = inputs_digest(path), STAMPS / f"{path.stem}.sha256"
    if not selection.run_all(request.config) and stamp.is_file() and stamp.read_text() == digest:
        pytest.skip(f"executed cleanly on these inputs before (stamp {stamp.relative_to(notebooks.ROOT)})")
    monkeypatch.setenv("MINI_INFER_FIGURES", str(tmp_path / "figures"))
    copy = shutil.copy(path, tmp_path / path.name)
    notebooks.execute(copy)
    nb = nbformat.read(copy, as_version=4)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    STAMPS.mkdir(parents=True, exist_ok=True)
    stamp.write_text(digest)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_typed_results_in_markdown(path):
    """Numbers come from code cells; markdown explains."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            assert not MEASURED.search(cell.source), cell.source


def test_kernel_runs_this_interpreter():
    name = notebooks.kernel_name()
    argv = notebooks.KernelSpecManager().get_kernel_spec(name).argv
    assert notebooks._runs_here(argv)
