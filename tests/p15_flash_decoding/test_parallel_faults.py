"""p15_flash_decoding: the engine over worker processes under faults (the shared suite tests/suites/parallel_faults.py)."""
from tests.suites.parallel_faults import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p15_flash_decoding"
