"""p19_quantization: a broken checkpoint directory is one clear error naming the file (the shared suite tests/suites/broken_checkpoint.py)."""
from tests.suites.broken_checkpoint import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p19_quantization"
