"""p16_tensor_parallel: the command line (the shared suite tests/suites/cli.py)."""
from tests.suites.cli import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p16_tensor_parallel"
