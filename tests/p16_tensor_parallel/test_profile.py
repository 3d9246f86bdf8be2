"""p16_tensor_parallel: the profile mode (the shared suite tests/suites/profile.py)."""
from tests.suites.profile import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p16_tensor_parallel"
