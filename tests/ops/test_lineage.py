"""Issue 25: the ``__lineage`` bookkeeping column of delivered rows must not depend on how rows
were cut into frames. After ``tokenize(split_long_samples=True)`` every row has it (``[]`` for a
document that needed no cut), never null, whatever the fetch batch size, runner or restore point."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tests.ops._tokenizers import make_texts, make_tokenizer
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar import frame as F
from zephon_columnar.ops.tokenize.op import TokenizeOp

MAX_LENGTH = 16
BATCH_ROWS = 4


def _texts() -> list[str]:
    """Mostly short documents (one piece each) and every ninth a long one (several pieces), so
    that many frames of a few rows hold no document that needs a cut."""
    short = make_texts(60, seed=3, max_words=4)
    long = make_texts(60, seed=4, max_words=60)
    return [long[i] if i % 9 == 4 else short[i] for i in range(60)]


TEXTS = _texts()


def _pipeline(*, fetch_rows: int | None = None, runner: str | None = None, batch: bool = True) -> Pipeline:
    ws = StaticMixtureWorkSource([Dataset.from_dict("d", {0: [{"text": t} for t in TEXTS]})], {"d": 1.0},
                                 chunk_size=8, seed=0, stop_after_passes=1)
    pipe = Pipeline(ws)
    if fetch_rows is not None:
        pipe = pipe.fetch(max_batch=fetch_rows)
    pipe = pipe.tokenize(tokenizer=make_tokenizer(), field="text", max_length=MAX_LENGTH, split_long_samples=True)
    if batch:
        pipe = pipe.batch(BATCH_ROWS)
    if runner is not None:
        pipe = pipe.options(runner=runner)
    return pipe


def _tables(items: list[Any]) -> list[pa.Table]:
    return [item.table for item in items]


def _first_difference(got: list[pa.Table], want: list[pa.Table]) -> str | None:
    """None when the streams are equal table by table (bookkeeping included), else what differs."""
    if len(got) != len(want):
        return f"{len(got)} batches, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if not g.equals(w):
            lineage = {name: t.column(F.LINEAGE).to_pylist() if F.LINEAGE in t.column_names else "absent"
                       for name, t in (("got", g), ("expected", w))}
            return f"batch {i}: columns {g.column_names} vs {w.column_names}, lineage {lineage}"
    return None


@pytest.fixture(scope="module")
def reference() -> list[pa.Table]:
    tables = _tables(list(_pipeline()))
    # The data must exercise both kinds of rows: documents cut into pieces and uncut ones.
    paths = [p for t in tables for p in F.lineage_paths(t)]
    assert () in paths and (1,) in paths
    return tables


def test_split_tokenize_gives_every_delivered_row_a_lineage_never_null(reference: list[pa.Table]) -> None:
    for table in reference:
        assert F.LINEAGE in table.column_names
        assert table.column(F.LINEAGE).null_count == 0
        assert table.schema.field(F.LINEAGE).type == pa.list_(pa.int32())
        assert table.column_names.index(F.LINEAGE) == table.column_names.index(F.COMPONENT) + 1


@pytest.mark.parametrize("fetch_rows, runner", [(1, None), (1, "threads"), (None, "threads"), (None, "process"),
                                                 (1, "process"), (3, "inline")])
def test_lineage_column_is_the_same_whatever_the_frame_size_runner_or_restore(
        reference: list[pa.Table], fetch_rows: int | None, runner: str | None) -> None:
    got = _tables(list(_pipeline(fetch_rows=fetch_rows, runner=runner)))
    assert _first_difference(got, reference) is None


@pytest.mark.parametrize("fetch_rows", [None, 1])
def test_lineage_column_is_the_same_after_a_checkpoint_restore(reference: list[pa.Table],
                                                               fetch_rows: int | None) -> None:
    for delivered in range(0, len(reference), 2):
        pipe = _pipeline(fetch_rows=fetch_rows)
        it = iter(pipe)
        first = _tables([next(it) for _ in range(delivered)])
        ckpt = json.loads(json.dumps(pipe.checkpoint()))
        it.close()
        resumed = _pipeline(fetch_rows=fetch_rows)
        resumed.restore(ckpt)
        rest = _tables(list(resumed))
        assert _first_difference(first + rest, reference) is None, f"restored after {delivered} batches"


def test_records_lineage_is_the_same_whatever_the_frame_size() -> None:
    def records(fetch_rows: int | None) -> list[tuple[Any, ...]]:
        return [(r.meta.sample_id, r.meta.lineage, list(r.payload["input_ids"]))
                for r in _pipeline(fetch_rows=fetch_rows, batch=False)]

    whole = records(None)
    assert whole == records(1)
    assert any(lineage for _, lineage, _ in whole) and any(not lineage for _, lineage, _ in whole)


def test_tokenize_frame_without_a_cut_still_has_the_lineage_column() -> None:
    op = TokenizeOp(tokenizer=make_tokenizer(), field="text", max_length=MAX_LENGTH, split_long_samples=True)
    out = op.process_frame(F.frame_of({"text": ["a b", ""]}))
    assert out.column(F.LINEAGE).to_pylist() == [[], []]
    assert op.process_frame(F.frame_of({"text": pa.array([], pa.string())})).column(F.LINEAGE).to_pylist() == []


def test_concat_frames_gives_rows_of_a_frame_without_lineage_empty_paths_in_place() -> None:
    cut = F.with_children(F.bookkeeping_of(F.frame_of({"x": [1]})), np.array([0, 0]), np.array([0, 1]))
    cut = F.with_payload(cut, pa.table({"x": [1, 1]}))
    plain = F.frame_of({"x": [2]}, first_row=1)
    for frames in ([cut, plain], [plain, cut]):
        joined = F.concat_frames(frames)
        assert joined.column(F.LINEAGE).null_count == 0
        assert joined.column_names == cut.column_names
    assert F.concat_frames([plain, cut]).column(F.LINEAGE).to_pylist() == [[], [0], [1]]
    # A frame in canonical form is returned as it is.
    assert F.with_lineage_column(cut) is cut


# ---------------------------------------------------------------- user operators after the cut
# A user operator after the splitting tokenize rebuilds frames from records. Where none of a
# frame's records had a non-empty path the rebuilt frame used to lack `__lineage`, so whether a
# delivered batch has the column depended on how rows were cut into frames (fetch size).


def _with_length(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "n_tokens": len(payload["input_ids"])}


def _records_with_length(records: list[Any]) -> list[Any]:
    for r in records:
        r.payload = _with_length(r.payload)
    return records


def _records_even_rows(records: list[Any]) -> list[Any]:
    # Drops some rows too, so that frames of only dropped rows and of only uncut rows occur.
    return [r for r in records if r.meta.sample_id[2] % 2 == 0 or r.meta.lineage]


def _lane_pairs(state: list[Any], records: list[Any]) -> tuple[list[Any], list[Any]]:
    # Holds records across pushes and lets them out two by two: output frames that do not
    # follow input frames.
    state = state + list(records)
    cut = len(state) - len(state) % 2
    return state[cut:], state[:cut]


def _hold_pieces(state: list[Any], records: list[Any]) -> tuple[list[Any], list[Any]]:
    # Lets uncut documents through at once and holds the pieces of cut ones until the flush:
    # every push then emits a frame of rows without a path.
    state = state + [r for r in records if r.meta.lineage]
    return state, [r for r in records if not r.meta.lineage]


def _user_op_pipeline(kind: str, fetch_rows: int | None) -> Pipeline:
    from zephon_columnar.ops.accumulators import CountingAccumulator

    pipe = _pipeline(fetch_rows=fetch_rows, batch=False)
    if kind == "map_transform":
        pipe = pipe.map_transform(_with_length)
    elif kind == "add_op records":
        pipe = pipe.add_op("length", process_many=_records_with_length, preserves_cursor_order=True)
    elif kind == "add_op records dropping":
        pipe = pipe.add_op("evens", process_many=_records_even_rows, preserves_cursor_order=True)
    elif kind == "add_op grouped":
        # batch_shape_sensitive: calls cut per lane by the accumulator (`AccumulatorStage`).
        pipe = pipe.add_op("length", process_many=_records_with_length, preserves_cursor_order=True,
                           batch_shape_sensitive=True, accumulator=lambda: CountingAccumulator(max_batch=3))
    elif kind == "stateful_transform":
        pipe = pipe.stateful_transform("pairs", init_state=list, push=_lane_pairs, flush=lambda state: state)
    elif kind == "stateful_transform holding pieces":
        pipe = pipe.stateful_transform("hold", init_state=list, push=_hold_pieces, flush=lambda state: state)
    elif kind == "stateful_transform with transform":
        pipe = pipe.stateful_transform("hold", init_state=list, push=_hold_pieces, flush=lambda state: state,
                                       transform=_records_with_length)
    else:
        raise AssertionError(kind)
    return pipe.batch(BATCH_ROWS)


USER_OPS = ["map_transform", "add_op records", "add_op records dropping", "add_op grouped", "stateful_transform",
            "stateful_transform holding pieces", "stateful_transform with transform"]


@pytest.fixture(scope="module")
def user_op_references() -> dict[str, list[pa.Table]]:
    return {kind: _tables(list(_user_op_pipeline(kind, None))) for kind in USER_OPS}


@pytest.mark.parametrize("kind", USER_OPS)
def test_lineage_column_survives_user_operators_whatever_the_frame_size(
        user_op_references: dict[str, list[pa.Table]], kind: str) -> None:
    want = user_op_references[kind]
    for table in want:
        assert table.column_names.index(F.LINEAGE) == table.column_names.index(F.COMPONENT) + 1
        assert table.column(F.LINEAGE).null_count == 0
        assert table.schema.field(F.LINEAGE).type == pa.list_(pa.int32())
    paths = [p for t in want for p in F.lineage_paths(t)]
    assert () in paths and (1,) in paths
    for fetch_rows in (1, 3):
        got = _tables(list(_user_op_pipeline(kind, fetch_rows)))
        assert _first_difference(got, want) is None, f"fetch(max_batch={fetch_rows})"


@pytest.mark.parametrize("kind", USER_OPS)
def test_lineage_column_survives_user_operators_across_a_checkpoint_restore(
        user_op_references: dict[str, list[pa.Table]], kind: str) -> None:
    want = user_op_references[kind]
    for fetch_rows in (None, 1):
        for delivered in range(1, len(want), 3):
            pipe = _user_op_pipeline(kind, fetch_rows)
            it = iter(pipe)
            first = _tables([next(it) for _ in range(delivered)])
            ckpt = json.loads(json.dumps(pipe.checkpoint()))
            it.close()
            resumed = _user_op_pipeline(kind, fetch_rows)
            resumed.restore(ckpt)
            got = first + _tables(list(resumed))
            assert _first_difference(got, want) is None, f"fetch(max_batch={fetch_rows}), restored after {delivered}"


def test_records_operator_keeps_the_lineage_column_of_a_frame_without_a_cut() -> None:
    from zephon_columnar.ops.rows import run_rows

    plain = F.frame_of({"x": [1, 2]})
    frame = F.with_payload(F.with_lineage_column(F.bookkeeping_of(plain)), F.payload_of(plain))
    out = run_rows(frame, lambda records: records, op_name="same")
    assert out.column_names == frame.column_names
    assert out.column(F.LINEAGE).to_pylist() == [[], []]
    # Every row dropped: the empty frame keeps it as well.
    assert F.LINEAGE in run_rows(frame, lambda records: [], op_name="none").column_names
    # A frame that never had the column does not get one.
    assert F.LINEAGE not in run_rows(F.frame_of({"x": [1]}), lambda records: records, op_name="same").column_names


# ---------------------------------------------------------------- which piece ends its sample
def _two_children(records: list) -> list:
    """Each record as two children (lines of 5 and 40 words); the second ends its sample."""
    from zephon_columnar.ops.children import spawn_child
    from zephon_columnar.types import SampleRecord

    return [SampleRecord(meta=spawn_child(r.meta, i, is_last_child=i == 1), payload={"text": "word " * n})
            for r in records for i, n in enumerate((5, 40))]


def _nested_pipeline(fetch_rows: int | None, runner: str = "inline") -> Pipeline:
    ws = StaticMixtureWorkSource([Dataset.from_dict("d", {0: [{"n": i} for i in range(7)]})], {"d": 1.0},
                                 chunk_size=3, seed=1)
    pipe = Pipeline(ws)
    if fetch_rows is not None:
        pipe = pipe.fetch(max_batch=fetch_rows)
    return (pipe.add_op("halves", process_many=_two_children, preserves_cursor_order=True)
            .tokenize(tokenizer=make_tokenizer(), field="text", max_length=MAX_LENGTH, split_long_samples=True)
            .options(runner=runner))


@pytest.mark.parametrize("fetch_rows, runner", [(None, "inline"), (1, "inline"), (2, "threads")])
def test_nested_fan_out_closes_each_source_sample_once(fetch_rows: int | None, runner: str) -> None:
    # A user's fan-out, then a splitting tokenize: only the last piece of the last child ends
    # its source sample (the first child's pieces and the long child's earlier pieces do not).
    records = list(_nested_pipeline(fetch_rows, runner))
    closing = [r.meta for r in records if any(ref.is_last_child for ref in r.meta.contributors)]
    assert sorted(m.sample_id for m in closing) == sorted({r.meta.sample_id for r in records})
    assert len(records) > 2 * len(closing)  # the long child was cut into pieces
    for meta in closing:
        pieces = [r.meta.lineage for r in records if r.meta.sample_id == meta.sample_id]
        assert meta.lineage == max(pieces) and meta.lineage[0] == 1
    assert all(len(r.meta.contributors) == 1 for r in records)  # a fanned-out row is its own contributor


def test_nested_fan_out_closing_flags_resume_exactly() -> None:
    def flags(records: list) -> list[tuple]:
        return [(r.meta.cursor, [ref.is_last_child for ref in r.meta.contributors]) for r in records]

    want = flags(list(_nested_pipeline(None)))
    for delivered in (1, 4, 9):
        pipe = _nested_pipeline(2)
        it = iter(pipe)
        first = [next(it) for _ in range(delivered)]
        ckpt = json.loads(json.dumps(pipe.checkpoint()))
        it.close()
        resumed = _nested_pipeline(None)
        resumed.restore(ckpt)
        assert flags(first) + flags(list(resumed)) == want, delivered


def test_packing_counts_a_cut_document_once() -> None:
    # component_sample_counts of packed rows count the samples a row ends: a document cut by
    # tokenize(split_long_samples=True) into pieces is one sample, counted on its last piece.
    pipe = _pipeline(batch=False).pack_flat(32, algorithm="best_fit_wrap", pad_token_id=0)  # keeps the last row
    counted = sum(n for item in pipe for n in item.meta.component_sample_counts.values())
    pieces = [r for r in _pipeline(batch=False) if len(r.payload["input_ids"])]  # packing skips empty ones
    documents = {r.meta.sample_id for r in pieces}
    assert len(pieces) > len(documents)
    assert counted == len(documents)


def test_concat_frames_gives_rows_of_a_frame_without_open_flags_false() -> None:
    cut = F.with_children(F.bookkeeping_of(F.frame_of({"x": [1]})), np.array([0, 0]), np.array([0, 1], np.int32))
    plain = F.bookkeeping_of(F.frame_of({"x": [2]}, first_row=1))
    joined = F.concat_frames([plain, cut])
    assert joined.column(F.OPEN).to_pylist() == [False, True, False]
    assert joined.column_names.index(F.OPEN) == joined.column_names.index(F.LINEAGE) + 1
