"""p19_quantization: bad input fails at once with a clear error and does no work (the shared suite tests/suites/bad_input.py)."""
from tests.suites.bad_input import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p19_quantization"
