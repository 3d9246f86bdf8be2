"""p19_quantization: prompts prefilled in chunks beside the decodes, the previous phase's tokens (the shared suite tests/suites/chunked_prefill.py)."""
from tests.suites.chunked_prefill import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE, PREVIOUS = "p19_quantization", "p13_speculative_decoding"
