"""p19_quantization: a generate() that fails mid-call leaves the engine usable (the shared suite tests/suites/recovery.py)."""
from tests.suites.recovery import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p19_quantization"
