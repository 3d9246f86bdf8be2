"""This phase's copy of the parallel code still works: 2 CPU replicas (gloo) and the 2-stage
pipeline each give exactly the tokens of the in-process engine. (p04's suite covers shutdown and
failures; tests/suites/parallel_faults.py the faults, where the worker code changed.)

Both tests run in every phase from p05 on: the pipeline's tail rebuilds each step from the head's
description, so a phase that changes how steps are planned (its scheduler, its sequences) can
break it without touching pipeline.py."""
import importlib

import pytest

from common.sampling import SamplingParams

OPTIONS = dict(device="cpu", dtype="float32", block_size=4, cpu_kv_cache_bytes=1 << 21)


@pytest.fixture(scope="module")
def engine(phase):
    return importlib.import_module(f"phases.{phase}")


@pytest.fixture(scope="module")
def batch(prompts_for, engine):
    """Three prompts (9, 32, 32 tokens), greedy and seeded-sampled, and the in-process tokens."""
    prompts = prompts_for("tiny-llama")[:3]
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0.8, top_p=0.9, max_tokens=16, seed=5, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)]
    return prompts, params, [o.token_ids for o in engine.LLM("tiny-llama", **OPTIONS).generate(prompts, params)]


def parallel_tokens(engine, mode: str, prompts, params) -> list[list[int]]:
    with engine.ParallelLLM("tiny-llama", **OPTIONS, parallel=mode, world_size=2) as llm:
        return [o.token_ids for o in llm.generate(prompts, params)]


@pytest.mark.timeout(120)
def test_replicas_give_the_in_process_tokens(engine, batch):
    prompts, params, expected = batch
    assert parallel_tokens(engine, "replica", prompts, params) == expected


@pytest.mark.timeout(120)
def test_pipeline_gives_the_in_process_tokens(engine, batch):
    prompts, params, expected = batch
    assert parallel_tokens(engine, "pipeline", prompts, params) == expected
