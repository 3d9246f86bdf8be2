"""p19_quantization: the profile mode (the shared suite tests/suites/profile.py)."""
from tests.suites.profile import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p19_quantization"
