"""p19_quantization: the OpenAI-compatible server over this phase's engine (the shared suite tests/suites/server.py)."""
from tests.suites.server import *  # noqa: F401,F403 - its tests and fixtures, collected here

PHASE = "p19_quantization"


def test_usage_reports_cached_prompt_tokens_and_metrics_the_hit_rate(server, client):
    """The same long prompt twice: the second reply's usage.prompt_tokens_details.cached_tokens
    (OpenAI's field) counts the prompt tokens read from the prefix cache, whole and streamed;
    /metrics counts them, and its hit rate is hits over queries."""
    url, _ = server
    prompt = "A prefix shared by two requests, long enough to fill several KV blocks. " * 8
    before = metrics(url)
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    second = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    n = first.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens < n - 16
    assert second.usage.prompt_tokens_details.cached_tokens == (n - 1) // 16 * 16   # full blocks, not the last token
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    usage = [chunk.usage for chunk in stream if chunk.usage is not None]
    assert usage[0].prompt_tokens_details.cached_tokens == (n - 1) // 16 * 16
    after = metrics(url)
    queries = after["prefix_cache_queries_total"] - before["prefix_cache_queries_total"]
    hits = after["prefix_cache_hits_total"] - before["prefix_cache_hits_total"]
    assert queries == 3 * n
    assert hits == first.usage.prompt_tokens_details.cached_tokens + 2 * (n - 1) // 16 * 16
    assert after["prefix_cache_hit_rate"] == pytest.approx(after["prefix_cache_hits_total"] /
                                                          after["prefix_cache_queries_total"], rel=1e-6)
