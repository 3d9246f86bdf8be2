"""p05_decode_profiling: the vectorized gather vs the per-sequence loop (the shared suite tests/suites/vectorized_gather.py)."""
from tests.suites.vectorized_gather import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p05_decode_profiling"
PREVIOUS = "p02_paged_kv"   # the per-sequence gather loop it is compared with
