"""p11_chunked_prefill: the OpenAI-compatible server over this phase's engine (the shared suite tests/suites/server.py)."""
from tests.suites.server import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p11_chunked_prefill"
