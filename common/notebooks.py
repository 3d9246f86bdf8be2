"""Execute the notebooks headless, in place: `python -m common.notebooks [NAME_OR_PATH ...]`.

Every notebooks/*.ipynb (or the ones named) runs top to bottom with nbclient in a kernel on this
interpreter, with the repository root as working directory, and is written back with its outputs.
Notebooks only read results/, so this is quick and needs no GPU.

Once they ran cleanly, notebooks/executed.json records the digest of what each one ran on (the
notebook, results/, common/, the pinned stack): `make test` runs a notebook again only when its
inputs differ from the recorded ones (tests/common/test_notebooks.py).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CELL_TIMEOUT_S = 300
OWN_KERNEL = "mini-infer"          # installed into this venv when "python3" would run another Python
EXECUTED = NOTEBOOKS / "executed.json"   # {notebook name: inputs_digest} of the last clean run here


def inputs_digest(path: Path) -> str:
    """What a notebook's run depends on: the notebook, every file under results/ (a review
    notebook reads other phases' records), the common/ code it calls, and the pinned stack."""
    digest = hashlib.sha256()
    inputs = [path, ROOT / "requirements.txt", *sorted((ROOT / "common").glob("*.py")),
              *sorted(f for f in (ROOT / "results").rglob("*") if f.is_file())]
    for f in inputs:
        digest.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


def executed_on_these_inputs(path: Path) -> bool:
    """Whether notebooks/executed.json says this notebook ran cleanly on exactly today's inputs."""
    done = json.loads(EXECUTED.read_text()) if EXECUTED.is_file() else {}
    return done.get(path.stem) == inputs_digest(path)


def record_executed(paths: list[Path]) -> None:
    """After clean runs (and once every notebook has written its figures): their digests."""
    done = json.loads(EXECUTED.read_text()) if EXECUTED.is_file() else {}
    done |= {p.stem: inputs_digest(p) for p in paths if p.parent == NOTEBOOKS}
    EXECUTED.write_text(json.dumps(dict(sorted(done.items())), indent=1) + "\n")


def _runs_here(argv: list[str]) -> bool:
    """jupyter_client swaps a bare 'python'/'python3'/'python3.X' for sys.executable."""
    bare = {"python", f"python{sys.version_info[0]}", "python{}.{}".format(*sys.version_info[:2])}
    exe = argv[0] if argv else ""
    return exe in bare or Path(exe).resolve() == Path(sys.executable).resolve()


def _spec_argv(name: str) -> list[str] | None:
    try:
        return KernelSpecManager().get_kernel_spec(name).argv
    except NoSuchKernel:
        return None


def kernel_name() -> str:
    """A kernel that runs this interpreter: "python3" when it does, else one installed here."""
    argv = _spec_argv("python3")
    if argv is not None and _runs_here(argv):
        return "python3"
    argv = _spec_argv(OWN_KERNEL)
    if argv is None or not _runs_here(argv):
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", OWN_KERNEL,
                        "--display-name", f"Python ({OWN_KERNEL})"], check=True, capture_output=True)
    return OWN_KERNEL


# matplotlib's inline backend: a figure a cell shows (plt.show(), or left open at the cell's end)
# lands in the cell's output as image/png, so the executed notebook carries its plots. Agg, the
# headless default, would draw nothing there.
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


def kernel_env() -> dict:
    """The kernel's environment: repo importable, figures inline (whatever MPLBACKEND says
    outside), no hub access."""
    path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    return os.environ | {"PYTHONPATH": path, "MPLBACKEND": INLINE_BACKEND, "HF_HUB_OFFLINE": "1",
                         "TRANSFORMERS_OFFLINE": "1"}


def execute(path: Path, kernel: str | None = None, timeout: int = CELL_TIMEOUT_S) -> Path:
    """Run one notebook in place (cwd = repo root); raises nbclient's CellExecutionError on failure."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel or kernel_name(),
                            resources={"metadata": {"path": str(ROOT)}}, record_timing=False)
    client.execute(cwd=str(ROOT), env=kernel_env())
    nbformat.write(nb, path)
    return path


def find(names: list[str]) -> list[Path]:
    """Notebook paths from names ("p01_serial_decode"), paths, or all of notebooks/ if none."""
    if not names:
        return sorted(NOTEBOOKS.glob("*.ipynb"))
    paths = [Path(n) if n.endswith(".ipynb") else NOTEBOOKS / f"{n}.ipynb" for n in names]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise SystemExit(f"no such notebook: {', '.join(missing)}")
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="*", help="names or paths (default: every notebooks/*.ipynb)")
    args = p.parse_args(argv)
    kernel, paths = kernel_name(), find(args.notebooks)
    for path in paths:
        print(f"[notebooks] executing {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}",
              flush=True)
        execute(path, kernel)
    record_executed(paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
