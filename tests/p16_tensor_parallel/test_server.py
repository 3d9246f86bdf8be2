"""p16_tensor_parallel: the OpenAI-compatible server over this phase's engine (the shared suite tests/suites/server.py)."""
from tests.suites.prefix_cache_server import *  # noqa: F401,F403 - the prefix cache in usage and /metrics
from tests.suites.server import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p16_tensor_parallel"

