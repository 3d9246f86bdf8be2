"""Every notebook runs headless, top to bottom, against the committed results/ (common.notebooks).

`make test-all` runs each notebook in a kernel of its own, as `make results` does. `make test`
runs the notebooks it has to run one after another in one kernel, the kernel's namespace reset
and its figures closed before each: the same cells, without a kernel start and the imports
(torch among them) per notebook."""
import re
import shutil

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from common import notebooks
from tests import selection

NOTEBOOKS = sorted(notebooks.NOTEBOOKS.glob("*.ipynb"))
MEASURED = re.compile(r"\d[\d,.]*\s*(tok/s|ms|s\b|%|GiB|GB/s|×|x\b)")


# Where a notebook that executed cleanly in `make test` leaves the digest of what it ran on
# (ignored by git; `make clean` removes it). `make results` keeps its own in notebooks/executed.json.
STAMPS = notebooks.ROOT / ".pytest_cache" / "notebooks"


def stamped(path) -> bool:
    """Ran cleanly on exactly these inputs: in `make results` (committed) or in an earlier `make test`."""
    stamp = STAMPS / f"{path.stem}.sha256"
    return notebooks.executed_on_these_inputs(path) or \
        (stamp.is_file() and stamp.read_text() == notebooks.inputs_digest(path))


def errors_of(nb) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]


def images_of(nb) -> list:
    """The PNG figures a notebook's code cells hold in their outputs."""
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]


# Before each notebook in the shared kernel: a namespace as a fresh kernel's, no figure left open,
# the repository root as working directory and the notebook's own figures folder.
FRESH = "_FRESH_NAMES = set(globals()) | {'_FRESH_NAMES'}"
RESET = """for _name in set(globals()) - _FRESH_NAMES:
    del globals()[_name]
import os as _os, matplotlib.pyplot as _plt
_plt.close("all")
_os.chdir({root!r})
_os.environ["MINI_INFER_FIGURES"] = {figures!r}
del _os, _plt"""


def run_in_one_kernel(paths, folder) -> dict:
    """Run copies (in `folder`) of these notebooks one after another in one kernel; returns
    {path: the executed copy, or the CellExecutionError that stopped it}."""
    results = {}
    if not paths:
        return results
    client = NotebookClient(nbformat.v4.new_notebook(), timeout=notebooks.CELL_TIMEOUT_S,
                            kernel_name=notebooks.kernel_name(), record_timing=False,
                            resources={"metadata": {"path": str(notebooks.ROOT)}})

    def run_own_cell(source: str):
        client.nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
        client.execute_cell(client.nb.cells[0], 0, store_history=False)

    with client.setup_kernel(cwd=str(notebooks.ROOT), env=notebooks.kernel_env()):
        run_own_cell(FRESH)
        for path in paths:
            run_own_cell(RESET.format(root=str(notebooks.ROOT), figures=str(folder / "figures" / path.stem)))
            client.nb = copy = nbformat.read(shutil.copy(path, folder / path.name), as_version=4)
            try:
                for index, cell in enumerate(copy.cells):
                    client.execute_cell(cell, index)
                results[path] = copy
            except CellExecutionError as e:
                results[path] = e
    return results


@pytest.fixture(scope="module")
def one_kernel_runs(tmp_path_factory, request):
    """The notebooks `make test` has to run (selected, and no stamp for their inputs), run in one kernel."""
    if selection.run_all(request.config):
        return {}
    chosen = {item.callspec.params["path"] for item in request.session.items
              if getattr(item, "originalname", None) == "test_notebook_executes"}
    return run_in_one_kernel([p for p in NOTEBOOKS if p in chosen and not stamped(p)],
                             tmp_path_factory.mktemp("notebooks"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch, request, one_kernel_runs):
    """Run a copy (the committed notebook keeps its stored outputs); cwd is the repo root, and its
    figures go to a temporary folder (the committed PNGs stay as the last deliberate run left them).

    A notebook runs once per change of what it runs on (notebooks.inputs_digest): after a clean
    run its digest is stamped (by `make results` in notebooks/executed.json, by `make test` under
    .pytest_cache/), and `make test` skips it (saying so) while the digest is the same; `make
    test-all` runs it regardless, in a kernel of its own. A fresh clone runs every notebook whose
    inputs changed since `make results` last ran it, all in one kernel (the module docstring)."""
    digest, stamp = notebooks.inputs_digest(path), STAMPS / f"{path.stem}.sha256"
    if selection.run_all(request.config):
        monkeypatch.setenv("MINI_INFER_FIGURES", str(tmp_path / "figures"))
        nb = nbformat.read(notebooks.execute(shutil.copy(path, tmp_path / path.name)), as_version=4)
    elif path not in one_kernel_runs:
        pytest.skip("executed cleanly on these inputs before (notebooks/executed.json or .pytest_cache/notebooks)")
    elif isinstance(one_kernel_runs[path], CellExecutionError):
        pytest.fail(f"{path.name} failed:\n{one_kernel_runs[path]}")
    else:
        nb = one_kernel_runs[path]
    assert not errors_of(nb)
    assert sum(bool(c.outputs) for c in nb.cells if c.cell_type == "code") > 0
    assert images_of(nb), f"{path.name} drew no figure into its outputs (plt.show() under Agg draws nothing)"
    STAMPS.mkdir(parents=True, exist_ok=True)
    stamp.write_text(digest)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebook_holds_its_figures(path):
    """The committed notebooks are executed ones (`make results`), read where they are stored,
    without a kernel: each holds at least one figure as an image/png output."""
    nb = nbformat.read(path, as_version=4)
    assert images_of(nb), f"{path.name} holds no image/png output: run `python -m common.notebooks {path.stem}`"


def test_the_kernel_draws_figures_inline():
    """The kernel's matplotlib backend is the inline one, whatever MPLBACKEND says outside it
    (under Agg, plt.show() draws nothing into the notebook)."""
    assert notebooks.kernel_env()["MPLBACKEND"] == notebooks.INLINE_BACKEND


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


def test_a_recorded_run_stands_until_an_input_changes(tmp_path, monkeypatch):
    """make results records each notebook's inputs; a change to the notebook, a result file or the
    common code makes make test run it again."""
    for name in ("notebooks", "common", "results/p01"):
        (tmp_path / name).mkdir(parents=True)
    nb, record, code = tmp_path / "notebooks" / "p01_x.ipynb", tmp_path / "results/p01/a.json", tmp_path / "common/x.py"
    for f, text in ((nb, "{}"), (record, "[]"), (code, "x = 1"), (tmp_path / "requirements.txt", "torch")):
        f.write_text(text)
    monkeypatch.setattr(notebooks, "ROOT", tmp_path)
    monkeypatch.setattr(notebooks, "NOTEBOOKS", tmp_path / "notebooks")
    monkeypatch.setattr(notebooks, "EXECUTED", tmp_path / "notebooks" / "executed.json")
    assert not notebooks.executed_on_these_inputs(nb)
    notebooks.record_executed([nb])
    assert notebooks.executed_on_these_inputs(nb)
    for f in (nb, record, code):
        before = f.read_text()
        f.write_text(before + " ")
        assert not notebooks.executed_on_these_inputs(nb), f
        f.write_text(before)
    assert notebooks.executed_on_these_inputs(nb)
