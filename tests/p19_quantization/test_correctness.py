"""p19_quantization: greedy exact match against HF, EOS handling, per-token timestamps (the shared suite tests/suites/correctness.py)."""
from tests.suites.correctness import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p19_quantization"
