"""p19_quantization: the command line in-process (the shared suite tests/suites/run_cli.py)."""
from tests.suites.run_cli import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p19_quantization"
