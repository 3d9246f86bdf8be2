"""p15_flash_decoding: this phase's copy of the replica code (the shared suite tests/suites/replicas.py)."""
from tests.suites.replicas import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p15_flash_decoding"
