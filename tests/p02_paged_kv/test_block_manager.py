"""BlockManager on its own: no model, no torch, milliseconds."""
import importlib
import inspect
import re

import pytest

from common.sampling import SamplingParams

PHASE = "p02_paged_kv"
block_manager = importlib.import_module(f"phases.{PHASE}.block_manager")
sequence = importlib.import_module(f"phases.{PHASE}.sequence")
BlockManager, Sequence = block_manager.BlockManager, sequence.Sequence


def seq(seq_id, prompt_len, max_tokens):
    return Sequence(seq_id, list(range(prompt_len)), SamplingParams(max_tokens=max_tokens), 0.0)


def prefill(bm, s):
    """Blocks for the prompt; the step samples the first output token."""
    bm.allocate(s)
    s.output_ids.append(0)


def decode(bm, s, steps=1):
    """Each step writes position num_tokens - 1 (needs its slot), then samples one more token."""
    for _ in range(steps):
        bm.append_slot(s)
        s.output_ids.append(0)


def test_is_torch_free():
    for module in (block_manager, sequence):
        assert not re.search(r"^\s*(import|from)\s+torch", inspect.getsource(module), re.M)


def test_allocate_covers_the_prompt_and_reserves_the_worst_case():
    bm = BlockManager(num_blocks=10, block_size=4)
    s = seq(0, prompt_len=5, max_tokens=7)          # 12 tokens at most -> 3 blocks
    bm.allocate(s)
    assert len(s.block_table) == 2                  # ceil(5 / 4)
    assert bm.num_free_blocks == 8 and bm.num_reserved == 1


def test_append_slot_takes_a_block_exactly_at_a_boundary():
    bm = BlockManager(num_blocks=10, block_size=4)
    s = seq(0, prompt_len=4, max_tokens=9)          # positions 0-3 fill block 1
    prefill(bm, s)
    assert len(s.block_table) == 1
    decode(bm, s)                                   # writes position 4: the first slot of block 2
    assert len(s.block_table) == 2
    decode(bm, s, 3)                                # positions 5-7 still fit in block 2
    assert len(s.block_table) == 2
    decode(bm, s)                                   # position 8 starts block 3
    assert len(s.block_table) == 3 and bm.num_reserved == 1   # 13 tokens -> 4 blocks at most


def test_can_allocate_counts_reservations():
    bm = BlockManager(num_blocks=6, block_size=4)
    a = seq(0, prompt_len=4, max_tokens=12)         # 1 block now, 3 more promised
    bm.allocate(a)
    assert bm.num_free_blocks == 5
    assert not bm.can_allocate(seq(1, prompt_len=4, max_tokens=5))   # needs 3; 5 free - 3 promised
    assert bm.can_allocate(seq(1, prompt_len=4, max_tokens=4))       # needs 2


def test_free_returns_blocks_and_reservation():
    bm = BlockManager(num_blocks=6, block_size=4)
    a = seq(0, prompt_len=6, max_tokens=10)
    prefill(bm, a)
    decode(bm, a, 3)
    bm.free(a)
    assert a.block_table == []
    assert bm.num_free_blocks == 6 and bm.num_reserved == 0 and bm.reserved == {}


def test_double_free_is_an_error():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = seq(0, prompt_len=3, max_tokens=2)
    bm.allocate(a)
    bm.free(a)
    with pytest.raises(RuntimeError, match="freed twice"):
        bm.free(a)
    assert bm.num_free_blocks == 4                  # the pool was not credited twice


def test_allocate_twice_or_past_the_pool_is_an_error():
    bm = BlockManager(num_blocks=2, block_size=4)
    a = seq(0, prompt_len=3, max_tokens=2)
    bm.allocate(a)
    with pytest.raises(RuntimeError, match="already holds blocks"):
        bm.allocate(a)
    with pytest.raises(RuntimeError, match="does not fit"):
        bm.allocate(seq(1, prompt_len=8, max_tokens=1))


def test_growing_past_max_tokens_is_an_error():
    bm = BlockManager(num_blocks=8, block_size=2)
    a = seq(0, prompt_len=2, max_tokens=2)         # 4 tokens -> 2 blocks at most
    prefill(bm, a)
    decode(bm, a, 2)                                # positions 2 and 3: block 2, then full
    with pytest.raises(RuntimeError, match="past its reservation"):
        decode(bm, a)                               # a step max_tokens never allows


def test_live_tables_are_disjoint_and_blocks_are_reused():
    bm = BlockManager(num_blocks=6, block_size=2)
    a, b = seq(0, 3, 1), seq(1, 4, 2)
    bm.allocate(a)
    bm.allocate(b)
    assert not set(a.block_table) & set(b.block_table)
    bm.free(a)
    c = seq(2, 5, 1)
    bm.allocate(c)
    assert not set(c.block_table) & set(b.block_table)
    assert sorted([*bm.free_ids, *b.block_table, *c.block_table]) == list(range(6))
