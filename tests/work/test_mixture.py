"""MixtureSpec validation/normalization and the smooth interleave of a chunk."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_columnar.errors import ConfigError
from zephon_columnar.work.mixture import MixtureSpec, interleave_order


def test_normalization_is_scale_invariant_and_follows_component_order():
    spec = MixtureSpec({"a": 1, "b": 3})
    assert spec.normalized_for(["a", "b"]) == {"a": 0.25, "b": 0.75}
    assert list(spec.normalized_for(["b", "a"])) == ["b", "a"]
    assert spec == MixtureSpec({"b": 0.75, "a": 0.25})
    assert spec != MixtureSpec({"a": 1, "b": 1})


def test_weights_property_is_a_copy():
    spec = MixtureSpec({"a": 2.0})
    spec.weights["a"] = 5.0
    assert spec.weights == {"a": 2.0}


def test_zero_weight_is_allowed_if_another_is_positive():
    assert MixtureSpec({"a": 0, "b": 2}).normalized_for(["a", "b"]) == {"a": 0.0, "b": 1.0}


@pytest.mark.parametrize(
    "weights, fragment",
    [
        ({}, "MixtureSpec must contain at least one component"),
        ({"web": -1}, "MixtureSpec weight for component 'web' must be positive"),
        ({"web": math.nan}, "'web'"),
        ({"web": math.inf}, "'web'"),
        ({"web": "0.5"}, "'web'"),
        ({"web": True}, "'web'"),
        ({"web": 0, "code": 0.0}, "sum to 0"),
        ({"alpha": 0.0}, "MixtureSpec weight for component 'alpha' must be positive"),
        ({1: 1.0}, "must be str"),
        ([("web", 1.0)], "mapping"),
    ],
)
def test_invalid_weights_raise_naming_the_problem(weights, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")):
        MixtureSpec(weights)


def test_validate_for_names_unknown_and_missing_components():
    spec = MixtureSpec({"web": 1, "cod": 1})
    with pytest.raises(ConfigError) as err:
        spec.validate_for(["web", "code"])
    msg = str(err.value)
    assert "MixtureSpec missing weights for components: code" in msg
    assert "MixtureSpec contains unknown components: cod" in msg
    assert "0 to leave it out" in msg
    with pytest.raises(ConfigError, match="MixtureSpec missing weights for components: code"):
        spec.normalized_for(["web", "code"])
    spec.validate_for(["cod", "web"])  # same names in another order are fine


def test_normalized_is_cached_in_the_order_given():
    spec = MixtureSpec({"beta": 2, "alpha": 1})
    assert spec.normalized is spec.normalized
    assert list(spec.normalized) == ["beta", "alpha"]
    assert spec.normalized == pytest.approx({"beta": 2 / 3, "alpha": 1 / 3})


def test_normalized_for_accepts_a_subset_with_the_whole_specs_shares():
    # As Zephon: only components without a weight raise; the shares are not renormalized.
    assert MixtureSpec({"a": 1, "b": 3}).normalized_for(["b"]) == {"b": 0.75}


# ---------------------------------------------------------------- interleave_order
def reference_interleave(counts):
    """Slow, exact definition: sort (Fraction((2i+1), 2c_k), k)."""
    keys = [(Fraction(2 * i + 1, 2 * c), k) for k, c in enumerate(counts) for i in range(c)]
    return [k for _, k in sorted(keys)]


@given(st.lists(st.integers(0, 40), min_size=1, max_size=6))
@settings(max_examples=150, deadline=None)
def test_interleave_matches_exact_definition_and_is_smooth(counts):
    got = interleave_order(counts)
    assert got.tolist() == reference_interleave(counts)
    assert np.bincount(got, minlength=len(counts)).tolist() == counts
    total = sum(counts)
    if total:
        # every prefix is within about len(counts)/2 samples of the chunk's composition
        onehot = np.zeros((total, len(counts)))
        onehot[np.arange(total), got] = 1
        prefix = np.cumsum(onehot, axis=0)
        ideal = np.arange(1, total + 1)[:, None] * (np.array(counts) / total)[None, :]
        assert np.abs(prefix - ideal).max() <= len(counts) / 2 + 0.5


def test_interleave_examples_and_ties_go_to_the_lower_component():
    assert interleave_order([3, 1]).tolist() == [0, 0, 1, 0]   # key 1/2 tie: component 0 first
    assert interleave_order([1, 3]).tolist() == [1, 0, 1, 1]
    assert interleave_order([2, 2]).tolist() == [0, 1, 0, 1]
    assert interleave_order([0, 0]).tolist() == []


def test_interleave_rejects_negative_counts():
    with pytest.raises(ConfigError, match="counts"):
        interleave_order([2, -1])


def test_interleave_of_a_full_size_chunk_matches_the_exact_definition():
    # A default-size chunk (16384): float keys must still tie exactly where the fractions do.
    # (Speed is measured in benchmarks/, not asserted here.)
    counts = [9000, 5000, 2000, 384]
    assert interleave_order(counts).tolist() == reference_interleave(counts)
