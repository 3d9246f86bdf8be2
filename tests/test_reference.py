"""The HF reference's file cache (tests/reference.py): a later session on the same inputs reads
the ids instead of running HF again; any input it depends on names another file; `make test-all`
computes them again."""
import pytest

from tests import reference


@pytest.fixture
def computed(tmp_path, monkeypatch):
    """Calls of the HF run (replaced by fixed ids), with the cache in a temporary folder."""
    calls = []
    monkeypatch.setattr(reference, "CACHE", tmp_path)
    monkeypatch.setattr(reference, "_compute", lambda preset: calls.append(preset) or [[1, 2], [3]])
    reference._hf_reference.cache_clear()
    yield calls
    reference._hf_reference.cache_clear()


def test_a_later_session_reads_the_file(computed, tmp_path):
    assert reference.hf_reference("tiny-llama") == [[1, 2], [3]] and computed == ["tiny-llama"]
    [file] = tmp_path.glob("*.json")                     # (beside it the lock workers take turns on)
    assert file.name == f"tiny-llama-{reference.reference_key('tiny-llama')}.json"
    reference._hf_reference.cache_clear()                 # a new session
    assert reference.hf_reference("tiny-llama") == [[1, 2], [3]] and computed == ["tiny-llama"]
    reference.hf_reference("tiny-llama", recompute=True)  # make test-all
    assert computed == ["tiny-llama", "tiny-llama"]


def test_the_key_follows_what_the_ids_depend_on(monkeypatch):
    key = reference.reference_key("tiny-llama")
    assert reference.reference_key("tiny-llama") == key != reference.reference_key("tiny-qwen2")
    monkeypatch.setattr(reference, "REF_NEW_TOKENS", reference.REF_NEW_TOKENS + 1)
    assert reference.reference_key("tiny-llama") != key
    monkeypatch.undo()
    monkeypatch.setattr(reference.torch, "__version__", "0.0")
    assert reference.reference_key("tiny-llama") != key
