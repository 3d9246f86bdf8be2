"""p19_quantization: requests joining between steps, block accounting (the shared suite tests/suites/continuous_batching.py)."""
from tests.suites.continuous_batching import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p19_quantization"
