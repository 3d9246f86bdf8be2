"""The server's account of the prefix cache (phase 12 on, where the cache exists): OpenAI's
usage.prompt_tokens_details.cached_tokens and /metrics' hit counters. A module of tests/pNN_*/
test_server.py imports it beside tests/suites/server.py, whose fixtures (server, client) it uses."""
import pytest

from tests.suites.server import MODEL, metrics


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
