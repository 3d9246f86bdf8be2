"""p18_pd_disaggregation: the command line in-process (the shared suite tests/suites/run_cli.py)."""
from tests.suites.run_cli import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p18_pd_disaggregation"
