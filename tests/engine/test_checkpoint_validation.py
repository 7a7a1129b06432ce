"""Hostile or corrupted checkpoints: every number is checked against the recipe and the data at
restore (or, for what only a replay can tell, as soon as the replay shows it), and the error is
a `CheckpointError` naming the field, never an overflow, an index error, a silent change of the
data or a long stall."""

from __future__ import annotations

import json
from typing import Any, Callable

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.engine.checkpoint import with_digests
from zephon_columnar.errors import CheckpointError

DS = Dataset.from_tables("a", [pa.table({"input_ids": [[i, i + 1, i + 2] for i in range(s * 100, s * 100 + 100)]})
                               for s in range(2)])


def by_reference() -> Pipeline:
    ws = StaticMixtureWorkSource([DS], {"a": 1.0}, seed=1, chunk_size=16, shuffle_within_shard=True)
    return Pipeline(ws).shuffle(8, seed=1).pack_flat(8, algorithm="wrap").batch(2).options(canonical_replicas=2)


def by_replay() -> Pipeline:
    ws = StaticMixtureWorkSource([DS], {"a": 1.0}, seed=1, chunk_size=16, shuffle_within_shard=True)
    return (Pipeline(ws).stateful_transform("keep", init_state=list, push=lambda s, rows: (s, rows))
            .batch(2).options(canonical_replicas=2))


def checkpoint_after(build: Callable[[], Pipeline], steps: int) -> dict[str, Any]:
    pipe = build()
    it = iter(pipe)
    for _ in range(steps):
        next(it)
    ckpt = json.loads(json.dumps(pipe.checkpoint()))
    it.close()
    return ckpt


def ids(items) -> list:
    return [b.to_training()["input_ids"].tolist() for b in items]


def lane0(c: dict) -> dict:
    return c["lanes"]["0"]


def source0(c: dict) -> dict:
    return lane0(c)["resume"]["source_state"]


def set_in(path: Callable[[dict], Any], key: Any, value: Any) -> Callable[[dict], None]:
    def mutate(c: dict) -> None:
        path(c)[key] = value
    return mutate


REFERENCE_CASES = {
    "global_index float": (set_in(source0, "global_chunk_index", 1e30), r"global_chunk_index = 1e\+30: not a count"),
    "global_index int": (set_in(source0, "global_chunk_index", 10**30), r"global_chunk_index = 10{30}: not a count"),
    "epoch float": (set_in(lambda c: source0(c)["cursor_states"]["a"], "epoch", 1e18), "epoch must be an int"),
    "epoch int": (set_in(lambda c: source0(c)["cursor_states"]["a"], "epoch", 10**18), "cannot have taken"),
    "accumulator exponent": (set_in(lambda c: source0(c)["cursor_states"]["a"], "accumulator", "1e10000000"),
                             "accumulator is '1e10000000', not a fraction"),
    "accumulator large": (set_in(lambda c: source0(c)["cursor_states"]["a"], "accumulator", "5/1"),
                          "beyond the"),
    "rows of a stage": (set_in(lambda c: lane0(c)["stages"][0]["rows"], "n", 10**12), r"stages\[0\]\.rows"),
    "a stage's counter": (set_in(lambda c: lane0(c)["stages"][0]["state"], "arrivals", 1e30), "arrivals"),
    "resume chunk": (set_in(lambda c: lane0(c)["resume"], "chunk", 10**15), "resume.chunk = 10{15} is past"),
    "resume offset": (set_in(lambda c: lane0(c)["resume"], "offset", float("nan")), "resume.offset = nan"),
    "a row past its shard": (set_in(lambda c: lane0(c)["stages"][0]["rows"]["cols"]["__row"], 0, 10**9),
                             r"row 1000000000 of shard .* of dataset 'a' \(id 0\), which has 100 rows"),
    "an unknown shard": (set_in(lambda c: lane0(c)["stages"][0]["rows"]["cols"]["__shard"], 0, 7),
                         r"shard 7 of dataset 'a' \(id 0\), which has no such shard"),
    "an unknown dataset": (set_in(lambda c: lane0(c)["stages"][0]["rows"]["cols"]["__dataset"], 0, 9),
                           "dataset id 9, not one of"),
    "another lane's row": (set_in(lambda c: lane0(c)["stages"][0]["rows"]["cols"]["__lane"], 0, 1),
                           "a row of lane 1"),
}


@pytest.mark.parametrize("case", sorted(REFERENCE_CASES))
def test_a_corrupt_by_reference_checkpoint_is_refused_at_restore_naming_the_field(case):
    mutate, message = REFERENCE_CASES[case]
    ckpt = checkpoint_after(by_reference, 5)
    assert lane0(ckpt)["mode"] == "reference" and lane0(ckpt)["stages"][0]["rows"]["n"] > 0
    mutate(ckpt)
    with pytest.raises(CheckpointError, match=message):
        by_reference().restore(ckpt)


REPLAY_CASES = {  # what only the replay shows is refused when the lane gets there (the edit resealed)
    "delivered rows": ("rows", 10**12, False, "10{12} rows of flush epoch 0 were delivered, it says, but replaying"),
    "input offset": ("inputs", 10**12, False, "resumes chunk 0 after 10{12} rows, but the chunk has 16"),
    "flush epoch": ("epoch", 10**12, True, "flush epoch 10{12} starts at chunk .* past the chunks"),
}


@pytest.mark.parametrize("case", sorted(REPLAY_CASES))
def test_a_corrupt_replay_checkpoint_is_refused_naming_the_field(case):
    field, value, at_restore, message = REPLAY_CASES[case]
    ckpt = checkpoint_after(by_replay, 3)
    assert lane0(ckpt)["mode"] == "replay"
    lane0(ckpt)[field] = value
    with pytest.raises(CheckpointError, match=message if at_restore else r"lanes\.0: its content does not match"):
        by_replay().restore(ckpt)  # as edited: the field's own check first, else the digest
    ckpt = with_digests(ckpt)  # a forged checkpoint: the engine's own checks still refuse it
    pipe = by_replay()
    with pytest.raises(CheckpointError, match=message):
        pipe.restore(ckpt)
        sum(1 for _ in pipe)
    if not at_restore:  # the replay is what told: restore() itself took it
        by_replay().restore(ckpt)


@pytest.mark.parametrize("build", [by_reference, by_replay])
def test_the_untouched_checkpoints_still_restore_exactly(build):
    full = ids(build())
    pipe = build()
    pipe.restore(checkpoint_after(build, 5))
    assert ids(pipe) == full[5:]


def numeric_leaves(value: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in numeric_leaves(v, path + (k,))]
    if isinstance(value, list):
        return [leaf for i, v in enumerate(value) for leaf in numeric_leaves(v, path + (i,))]
    return [path] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


@settings(max_examples=60, deadline=None)
@given(pick=st.integers(0, 10**6), replay=st.booleans(),
       value=st.sampled_from([2**63, -(2**63), 10**30, 1e30, float("inf"), float("-inf"), float("nan")]))
def test_property_any_number_out_of_range_is_refused_at_restore(pick, replay, value):
    ckpt = checkpoint_after(by_replay if replay else by_reference, 5)
    leaves = numeric_leaves(ckpt["lanes"])
    path = leaves[pick % len(leaves)]
    node = ckpt["lanes"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(CheckpointError, match="not a count or position"):
        (by_replay if replay else by_reference)().restore(ckpt)


def by_bins() -> Pipeline:
    ws = StaticMixtureWorkSource([DS], {"a": 1.0}, seed=1, chunk_size=16, shuffle_within_shard=True)
    return Pipeline(ws).pack_flat(8, algorithm="first_fit", num_bins=3).batch(2).options(prefetch_batches=2,
                                                                                        runner="threads")


HELD_ROWS_CUT = {  # (build, where, damage, forged too): each used to restore and lose or change rows
    "pending rows set to null": (by_bins, lambda c: lane0(c)["pending"], "rows", None),
    "a stage's rows set to null": (by_reference, lambda c: lane0(c)["stages"][0], "rows", None),
    "a row reference of 1.5": (by_reference, lambda c: lane0(c)["stages"][0]["rows"]["cols"]["__row"], 0, 1.5),
    "a row reference of -1": (by_reference, lambda c: lane0(c)["stages"][0]["rows"]["cols"]["__row"], 0, -1),
}


@pytest.mark.parametrize("case", sorted(HELD_ROWS_CUT))
@pytest.mark.parametrize("forged", [False, True])
def test_held_rows_cut_or_mistyped_are_refused_naming_the_field(case, forged):
    """Issue 25: held rows cut to null restored without error and silently lost the rows; row
    references of 1.5 or -1 were accepted and changed the stream. Refused, as edited and even
    with the digest computed again."""
    build, where, key, value = HELD_ROWS_CUT[case]
    ckpt = checkpoint_after(build, 5)
    assert where(ckpt)[key] not in (None, {"n": 0, "cols": {}})  # rows were held
    where(ckpt)[key] = value
    if forged:
        ckpt = with_digests(ckpt)
    with pytest.raises(CheckpointError, match=r"checkpoint lanes\.0\.(pending|stages\[0\])\.rows"):
        build().restore(ckpt)


def test_a_packer_bin_moved_is_refused():
    """Issue 25: a packer's bin number changed in the checkpoint was accepted and changed the
    stream: the digest refuses it."""
    ckpt = checkpoint_after(by_bins, 5)
    state = lane0(ckpt)["stages"][0]["state"]
    assert state["groups"], state
    text = json.dumps(state["groups"])
    digits = [i for i, ch in enumerate(text) if ch.isdigit()]
    moved = text[:digits[-1]] + str((int(text[digits[-1]]) + 1) % 10) + text[digits[-1] + 1:]
    lane0(ckpt)["stages"][0]["state"]["groups"] = json.loads(moved)
    with pytest.raises(CheckpointError, match=r"lanes\.0: its content does not match its digest"):
        by_bins().restore(ckpt)


def test_a_recipe_with_an_operator_removed_names_that_operator_not_both_lists():
    ckpt = checkpoint_after(by_reference, 2)
    ws = StaticMixtureWorkSource([DS], {"a": 1.0}, seed=1, chunk_size=16, shuffle_within_shard=True)
    without_shuffle = Pipeline(ws).pack_flat(8, algorithm="wrap").batch(2).options(canonical_replicas=2)
    with pytest.raises(CheckpointError, match="different data recipe") as info:
        without_shuffle.restore(ckpt)
    assert "ops[1] (shuffle): in the checkpoint, absent here (shuffle(" in str(info.value)
    assert "pack_flat" not in str(info.value)  # the operators that agree are not dumped


def test_a_recipe_with_an_operator_argument_changed_names_the_operator_and_the_argument():
    ckpt = checkpoint_after(by_reference, 2)
    ws = StaticMixtureWorkSource([DS], {"a": 1.0}, seed=1, chunk_size=16, shuffle_within_shard=True)
    other_seed = Pipeline(ws).shuffle(8, seed=2).pack_flat(8, algorithm="wrap").batch(2).options(canonical_replicas=2)
    with pytest.raises(CheckpointError, match=r"ops\[1\] \(shuffle\)\.seed: 1 in the checkpoint, 2 here"):
        other_seed.restore(ckpt)


def test_a_row_past_its_shard_names_the_dataset_and_the_shard_file(tmp_path):
    import pyarrow.parquet as pq

    for s in range(2):
        pq.write_table(pa.table({"input_ids": [[i, i + 1] for i in range(s * 50, s * 50 + 50)]}),
                       tmp_path / f"part-{s}.parquet")

    def build() -> Pipeline:
        ws = StaticMixtureWorkSource([Dataset.from_path("web", str(tmp_path))], {"web": 1.0}, seed=1, chunk_size=16)
        return Pipeline(ws).shuffle(8, seed=1).pack_flat(8, algorithm="wrap").batch(2).options(canonical_replicas=2)

    ckpt = checkpoint_after(build, 2)
    cols = lane0(ckpt)["stages"][0]["rows"]["cols"]
    shard = cols["__shard"][0]
    cols["__row"][0] = 10**9
    with pytest.raises(CheckpointError) as info:
        build().restore(ckpt)
    assert f"row 1000000000 of shard {tmp_path / f'part-{shard}.parquet'} ({shard}) of dataset 'web' (id 0)" in str(
        info.value), str(info.value)
