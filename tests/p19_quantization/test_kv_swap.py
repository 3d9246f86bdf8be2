"""p19_quantization: swapping K/V blocks to host memory and back (the shared suite tests/suites/kv_swap.py)."""
from tests.suites.kv_swap import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p19_quantization"
