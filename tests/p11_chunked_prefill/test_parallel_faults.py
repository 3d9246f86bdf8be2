"""p11_chunked_prefill: the engine over worker processes under faults (the shared suite tests/suites/parallel_faults.py)."""
from tests.suites.parallel_faults import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p11_chunked_prefill"
