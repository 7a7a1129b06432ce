"""Token-unit mixtures in the work layer: `TokenEstimation`, calibration rows, priming, state."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from zephon_columnar.errors import CheckpointError, ConfigError
from zephon_columnar.io.dataset import Dataset
from zephon_columnar.work import StaticMixtureWorkSource, TokenEstimation
from zephon_columnar.work.token_estimation import PerShardTokenCost, TokenRatio, calibration_rows, sample_weights

from tests.work._helpers import take


def text_ds(name: str, shards: int, rows: int, chars: int) -> Dataset:
    """A dataset whose rows are ``chars``-character texts (stored bytes grow with ``chars``)."""
    return Dataset.from_tables(name, [pa.table({"text": ["x" * chars] * rows}) for _ in range(shards)])


SHORT, LONG = text_ds("short", 3, 50, 10), text_ds("long", 3, 50, 400)


def source(estimation: TokenEstimation | None, **kwargs):
    args = dict(chunk_size=40, seed=3, exhausted_policy="repeat")
    args.update(kwargs)
    return StaticMixtureWorkSource([SHORT, LONG], {"short": 0.5, "long": 0.5}, token_estimation=estimation, **args)


def composition(ws, chunks: int = 50) -> dict[str, int]:
    out = {"short": 0, "long": 0}
    for c in take(ws, chunks):
        for name, pointers in c.components.items():
            out[name] += len(pointers)
    return out


def per_sample_bytes(ds: Dataset) -> float:
    return float(np.sum(ds.raw_bytes())) / ds.total()


def test_equal_token_weights_draw_samples_inversely_to_their_length():
    ws = source(TokenEstimation(primer=0.25))
    assert ws.requires_token_priming  # as in Zephon: prime() first, even with the ratios stated
    ws.prime()                        # (no counting: the primer's ratios are used as they are)
    assert not ws.requires_token_priming and ws.tokens_per_byte == {"short": 0.25, "long": 0.25}
    drawn = composition(ws)
    expected = per_sample_bytes(LONG) / per_sample_bytes(SHORT)  # same ratio: samples ~ 1 / bytes
    assert drawn["short"] / drawn["long"] == pytest.approx(expected, rel=0.02)
    # sample units, for contrast: half and half
    assert composition(source(None)) == {"short": 1000, "long": 1000}


def test_per_dataset_ratios_shift_the_draws_and_chunks_carry_the_token_weights():
    ws = source(TokenEstimation(primer={"short": 1.0, "long": 0.25}))
    ws.prime()
    c = ws.next_chunk()
    assert c.target_mixture == {"short": 0.5, "long": 0.5}
    drawn = composition(ws)
    expected = 0.25 * per_sample_bytes(LONG) / (1.0 * per_sample_bytes(SHORT))
    assert drawn["short"] / drawn["long"] == pytest.approx(expected, rel=0.05)


def test_measure_primer_needs_priming_before_the_first_chunk():
    ws = source(TokenEstimation())
    assert ws.requires_token_priming and ws.tokens_per_byte is None
    with pytest.raises(RuntimeError, match="primed"):
        ws.next_chunk()


def test_prime_from_counts_measures_tokens_per_stored_byte():
    ws = source(TokenEstimation(calibration_samples=60))
    pointers = ws.calibration_pointers()
    assert {k: len(p) for k, p in pointers.items()} == {0: 60, 1: 60}  # 3 shards x 20 rows
    ws.prime({0: np.full(60, 3), 1: np.full(60, 100)})
    assert not ws.requires_token_priming
    assert ws.tokens_per_byte == pytest.approx({"short": 3 / per_sample_bytes(SHORT),
                                                "long": 100 / per_sample_bytes(LONG)})
    drawn = composition(ws)
    assert drawn["short"] / drawn["long"] == pytest.approx(100 / 3, rel=0.05)


def test_a_dataset_without_counted_tokens_gets_the_fallback_with_a_warning():
    ws = source(TokenEstimation(fallback_tokens_per_byte=0.5))
    n = len(ws.calibration_pointers()[1])
    with pytest.warns(UserWarning, match=r"\['short'\].*fallback_tokens_per_byte=0.5"):
        ws.prime({0: np.zeros(len(ws.calibration_pointers()[0])), 1: np.full(n, 7)})
    assert ws.tokens_per_byte["short"] == 0.5


def test_ratios_persist_in_the_state_and_a_restored_source_continues_exactly():
    ws = source(TokenEstimation())
    ws.prime({k: np.full(len(p), 5 + 40 * k) for k, p in ws.calibration_pointers().items()})
    take(ws, 7)
    state = json.loads(json.dumps(ws.state_dict()))
    # Zephon's layout: {name: [tokens per byte, source]}
    assert state["token_ratios"] == {n: [r, "measured"] for n, r in ws.tokens_per_byte.items()}
    assert state["allocation_mode"] == "token_aware"
    expected = take(ws, 20)
    fresh = source(TokenEstimation())
    fresh.load_state_dict(state)
    assert not fresh.requires_token_priming  # no second measurement
    assert take(fresh, 20) == expected


def test_each_ratio_says_where_it_came_from():
    stated = source(TokenEstimation(primer=0.3))
    stated.prime()
    assert {source for _, source in stated.state_dict()["token_ratios"].values()} == {"pinned"}
    unmeasured = source(TokenEstimation())
    with pytest.warns(UserWarning, match="no tokens counted"):
        unmeasured.prime({})
    assert {source for _, source in unmeasured.state_dict()["token_ratios"].values()} == {"fallback"}
    restored = source(TokenEstimation())
    restored.load_state_dict(json.loads(json.dumps(unmeasured.state_dict())))
    assert restored.state_dict()["token_ratios"] == unmeasured.state_dict()["token_ratios"]


def test_lanes_cloned_after_priming_partition_the_primed_stream():
    ws = source(TokenEstimation(primer=0.3))
    ws.prime()
    whole = take(ws.clone_for_lane(0, 1), 12)
    lanes = [ws.clone_for_lane(lane, 3) for lane in range(3)]
    got = sorted((c for lane in lanes for c in take(lane, 4)), key=lambda c: c.global_index)
    assert [c.global_index for c in got] == list(range(12))
    assert got == whole


@pytest.mark.parametrize("state_ratios, fragment", [
    ({"short": 0.3}, "every dataset"),
    ({"short": 0.3, "long": -1.0}, "long"),
    ({"short": 0.3, "long": "1e400"}, "long"),
])
def test_bad_ratios_in_a_state_name_the_field(state_ratios, fragment):
    ws = source(TokenEstimation())
    ws.prime({k: np.full(len(p), 9) for k, p in ws.calibration_pointers().items()})
    state = ws.state_dict()
    state["token_ratios"] = state_ratios
    with pytest.raises(CheckpointError, match="tokens_per_byte") as err:
        source(TokenEstimation()).load_state_dict(state)
    assert fragment in str(err.value)


def test_a_token_mixture_checkpoint_does_not_restore_into_a_sample_mixture():
    state = source(TokenEstimation(primer=0.3)).state_dict()
    with pytest.raises(CheckpointError, match="mixture_unit"):
        source(None).load_state_dict(state)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(primer="guess"), "primer"),
    (dict(primer=0.0), "primer"),
    (dict(primer={"short": float("nan"), "long": 1.0}), "short"),
    (dict(measure="len"), "measure"),
    (dict(calibration_samples=0), "calibration_samples"),
    (dict(calibration_shards_min=8, calibration_shards_max=4), "calibration_shards_min"),
    (dict(fallback_tokens_per_byte=-1), "fallback_tokens_per_byte"),
])
def test_bad_estimations_raise_value_errors_naming_the_argument(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        TokenEstimation(**kwargs)


def test_a_primer_dict_must_name_exactly_the_datasets():
    with pytest.raises(ConfigError, match=r"missing \['long'\], unknown \['code'\]"):
        source(TokenEstimation(primer={"short": 0.3, "code": 0.2}))


def test_calibration_rows_are_contiguous_runs_in_a_bounded_number_of_shards():
    est = TokenEstimation(calibration_samples=100, calibration_shards_min=2, calibration_shards_max=4)
    counts = np.array([30, 0, 500, 500, 500, 500, 500, 500])
    rows = calibration_rows(counts, est, seed=1, dataset_index=0)
    shards = np.unique(rows[:, 0])
    assert len(shards) == 4 and 1 not in shards
    for s in shards:
        r = rows[rows[:, 0] == s, 1]
        assert np.array_equal(r, np.arange(r[0], r[0] + len(r))) and r[-1] < counts[s]
    assert np.array_equal(rows, calibration_rows(counts, est, seed=1, dataset_index=0))  # deterministic
    assert not np.array_equal(rows, calibration_rows(counts, est, seed=2, dataset_index=0))


def test_sample_weights_turn_token_weights_into_sample_proportions():
    got = sample_weights({"a": 0.25, "b": 0.75, "c": 0.0}, tokens_per_sample={"a": 10.0, "b": 90.0, "c": 5.0})
    assert got == pytest.approx({"a": 0.025 / (0.025 + 0.75 / 90), "b": (0.75 / 90) / (0.025 + 0.75 / 90), "c": 0.0})


def test_a_dataset_without_byte_metadata_is_costed_flat_with_a_warning():
    ghost = Dataset(name="ghost", backend={"kind": "inmem"})  # Zephon's descriptor form: no shards
    assert ghost.counts().tolist() == [] and ghost.total() == 0
    with pytest.warns(RuntimeWarning, match="no byte metadata"):
        costs = PerShardTokenCost({"ghost": ghost}, {"ghost": TokenRatio(0.5, "pinned")})
    assert costs.cost("ghost", (0, 0, 0)) == costs.mean_cost("ghost") == 1.0
