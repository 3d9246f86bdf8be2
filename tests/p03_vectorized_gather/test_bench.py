"""p03_vectorized_gather: its bench module (the shared suite tests/suites/gather_bench.py)."""
from tests.suites.gather_bench import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p03_vectorized_gather"
