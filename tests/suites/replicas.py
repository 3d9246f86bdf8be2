"""This phase's copy of the replica code still works: 2 CPU replicas (gloo) give exactly the
tokens of the in-process engine. (p04's suite covers the pipeline, shutdown and failures.)"""
import importlib

import pytest

from common.sampling import SamplingParams

OPTIONS = dict(device="cpu", dtype="float32", block_size=4, cpu_kv_cache_bytes=1 << 21)


@pytest.mark.timeout(120)
def test_replicas_give_the_in_process_tokens(prompts_for, phase):
    engine = importlib.import_module(f"phases.{phase}")
    prompts = prompts_for("tiny-llama")[:3]
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0.8, top_p=0.9, max_tokens=16, seed=5, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)]
    expected = engine.LLM("tiny-llama", **OPTIONS).generate(prompts, params)
    with engine.ParallelLLM("tiny-llama", **OPTIONS, parallel="replica", world_size=2) as llm:
        outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == [e.token_ids for e in expected]
