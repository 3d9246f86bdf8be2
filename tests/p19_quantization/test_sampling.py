"""p19_quantization: seeded sampling, top-k/top-p, stop strings, max_tokens, ignore_eos (the shared suite tests/suites/sampling.py)."""
from tests.suites.sampling import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p19_quantization"
