"""p19_quantization: the command line (the shared suite tests/suites/cli.py)."""
from tests.suites.cli import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p19_quantization"
