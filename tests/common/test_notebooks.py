"""Every notebook runs headless, top to bottom, against the committed results/ (common.notebooks)."""
import re
import shutil

import nbformat
import pytest

from common import notebooks

NOTEBOOKS = sorted(notebooks.NOTEBOOKS.glob("*.ipynb"))
MEASURED = re.compile(r"\d[\d,.]*\s*(tok/s|ms|s\b|%|GiB|GB/s|×|x\b)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch):
    """Run a copy (the committed notebook keeps its stored outputs); cwd is the repo root, and its
    figures go to tmp_path (the committed PNGs stay as the last deliberate run left them)."""
    monkeypatch.setenv("MINI_INFER_FIGURES", str(tmp_path / "figures"))
    copy = shutil.copy(path, tmp_path / path.name)
    notebooks.execute(copy)
    nb = nbformat.read(copy, as_version=4)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors


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
