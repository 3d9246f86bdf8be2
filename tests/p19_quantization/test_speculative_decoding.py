"""p19_quantization: greedy tokens of the previous phase under every proposer and k, drafts refused anywhere, requests ending inside a proposal, rollback, the prefix cache, rejection sampling's distribution (the shared suite tests/suites/speculative_decoding.py)."""
from tests.suites.speculative_decoding import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE, PREVIOUS = "p19_quantization", "p13_speculative_decoding"
