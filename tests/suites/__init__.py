"""Engine test suites written once and run against every phase that has the feature.

A phase opts in with a two-line module, tests/pNN_topic/test_<suite>.py:

    from tests.suites.<suite> import *
    PHASE = "pNN_topic"

The fixtures in tests/conftest.py (phase, LLM, PrevLLM, Sequence, cli) read PHASE from there.
"""
