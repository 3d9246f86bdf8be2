"""p13_speculative_decoding: greedy exact match against HF, EOS handling, per-token timestamps (the shared suite tests/suites/correctness.py)."""
from tests.suites.correctness import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p13_speculative_decoding"
