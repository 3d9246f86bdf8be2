"""p19_quantization: random engine configurations and interrupted calls against each request run alone (the shared suite tests/suites/config_fuzz.py)."""
from tests.suites.config_fuzz import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p19_quantization"
