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
        "ops[0] (tokenize).field: 'text' in the checkpoint, 'body' here",
        "seed: 3 in the checkpoint, 4 here",
    ]


def test_lists_of_other_lengths_differ_as_a_whole():
    assert recipe_differences({"lanes": [0, 1]}, {"lanes": [0, 1, 2]}) == [
        "lanes: [0, 1] in the checkpoint, [0, 1, 2] here"
    ]


SHUFFLE = {"op": "shuffle", "seed": 1, "buffer_size": 8}
PACK = {"op": "pack_flat", "max_length": 8, "algorithm": "wrap"}
BATCH = {"op": "batch", "microbatch_size": 2}


def test_an_operator_with_another_argument_is_named_by_position_and_name():
    saved = {"ops": [{"op": "fetch"}, SHUFFLE, PACK, BATCH]}
    current = {"ops": [{"op": "fetch"}, SHUFFLE, {**PACK, "algorithm": "first_fit"}, BATCH]}
    assert recipe_differences(saved, current) == [
        "ops[2] (pack_flat).algorithm: 'wrap' in the checkpoint, 'first_fit' here"
    ]


def test_an_operator_removed_or_added_is_named_alone_not_the_lists():
    saved, current = {"ops": [{"op": "fetch"}, SHUFFLE, PACK, BATCH]}, {"ops": [{"op": "fetch"}, PACK, BATCH]}
    assert recipe_differences(saved, current) == [
        "ops[1] (shuffle): in the checkpoint, absent here (shuffle(buffer_size=8, seed=1))"
    ]
    assert recipe_differences(current, saved) == [
        "ops[1] (shuffle): absent in the checkpoint, here (shuffle(buffer_size=8, seed=1))"
    ]


def test_another_operator_in_the_same_place_names_both():
    saved = {"ops": [{"op": "fetch"}, SHUFFLE, BATCH]}
    current = {"ops": [{"op": "fetch"}, {"op": "filter", "predicate": "x > 1"}, BATCH]}
    (diff,) = recipe_differences(saved, current)
    assert diff.startswith("ops[1]: shuffle in the checkpoint, filter here")
    assert "'x > 1'" in diff and "seed=1" in diff and "pack_flat" not in diff
