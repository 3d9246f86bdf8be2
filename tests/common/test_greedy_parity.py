"""common.greedy_parity: where two greedy token sequences part, and the records it builds."""
from common.greedy_parity import compare, first_difference


def test_first_difference_is_the_first_unequal_position_or_none():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([4], [5]) == 0
    assert first_difference([1, 2], [1, 2, 3]) == 2         # one stopped early: they part there


def test_compare_counts_the_prompts_that_part_and_their_median_position():
    row = compare("x", [[1, 2, 3], [1, 2, 3], [7, 8, 9]], [[1, 2, 3], [1, 0, 0], [7, 8, 0]])
    assert row == {"comparison": "x", "prompts": 3, "parted": 2, "first_position_median": 1.5,
                   "first_positions": [None, 1, 2]}
    assert compare("y", [[1]], [[1]])["first_position_median"] is None
