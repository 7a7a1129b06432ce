"""recipe_differences: every leaf that differs is named once, with both values; JSON-equal values
(a tuple and the list a JSON round trip makes of it) are equal."""

from __future__ import annotations

from zephon_columnar.recipes import recipe_differences


def test_equal_recipes_have_no_differences_even_through_json():
    saved = {"seed": 3, "mixture": {"a": 0.5, "b": 0.5}, "lanes": [0, 1]}
    assert recipe_differences(saved, {"seed": 3, "mixture": {"b": 0.5, "a": 0.5}, "lanes": (0, 1)}) == []


def test_each_differing_leaf_is_named_with_both_values():
    saved = {"seed": 3, "ops": [{"op": "tokenize", "field": "text"}], "chunk_size": 8, "old": 1}
    current = {"seed": 4, "ops": [{"op": "tokenize", "field": "body"}], "chunk_size": 8, "new": 2}
    assert recipe_differences(saved, current) == [
        "new: absent in the checkpoint, 2 here",
        "old: 1 in the checkpoint, absent here",
        "ops[0].field: 'text' in the checkpoint, 'body' here",
        "seed: 3 in the checkpoint, 4 here",
    ]


def test_lists_of_other_lengths_differ_as_a_whole():
    assert recipe_differences({"lanes": [0, 1]}, {"lanes": [0, 1, 2]}) == [
        "lanes: [0, 1] in the checkpoint, [0, 1, 2] here"]
