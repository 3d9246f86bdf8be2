"""Run a check in Triton's interpreter: a fresh Python process, since TRITON_INTERPRET=1 must be
set before triton is first imported (and this test process may already have imported it)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_interpreted(code: str):
    """Run `code` with TRITON_INTERPRET=1 from the repository root; its last stdout line is JSON."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(ROOT),
                                                                            "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
