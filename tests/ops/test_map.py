"""MapOp / FilterOp on frames: columnar and row forms agree; errors name the operator."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError, PipelineError
from zephon_columnar.ops.map import FilterOp, MapOp


def frame(n: int = 6) -> pa.Table:
    book = F.pointer_frame(lane=2, chunk_id=1, offsets=np.arange(n), pointers=np.array([[0, 0, i] for i in range(n)]),
                           components=np.zeros(n, np.int32))
    return F.with_payload(book, pa.table({"x": list(range(n)), "s": [f"w{i}" for i in range(n)]}))


def test_polars_and_callable_maps_agree():
    a = MapOp((pl.col("x") * 10).alias("y")).process_frame(frame())
    b = MapOp(lambda p: {**p, "y": p["x"] * 10}).process_frame(frame())
    assert a.column("y").to_pylist() == b.column("y").to_pylist() == [0, 10, 20, 30, 40, 50]
    assert a.column(F.LANE).to_pylist() == [2] * 6 and b.column(F.ROW).to_pylist() == list(range(6))


def test_callable_none_drops_rows_and_their_bookkeeping():
    out = MapOp(lambda p: p if p["x"] % 2 else None).process_frame(frame())
    assert out.column("x").to_pylist() == [1, 3, 5]
    assert out.column(F.OFFSET).to_pylist() == [1, 3, 5]


def test_all_rows_dropped():
    out = MapOp(lambda p: None).process_frame(frame())
    assert out.num_rows == 0


def test_filter_forms():
    assert FilterOp(pl.col("x") > 3).process_frame(frame()).column("x").to_pylist() == [4, 5]
    assert FilterOp(lambda p: p["s"] == "w2").process_frame(frame()).column("x").to_pylist() == [2]


def test_bad_arguments_and_outputs():
    with pytest.raises(ConfigError, match="map_transform"):
        MapOp(42)
    with pytest.raises(ConfigError, match="filter"):
        FilterOp(42)
    with pytest.raises(TypeError, match="returned a list"):
        MapOp(lambda p: [p]).process_frame(frame())
    with pytest.raises(PipelineError, match="nope"):
        MapOp(pl.col("nope") + 1).process_frame(frame())


def test_polars_expressions_cannot_touch_bookkeeping():
    out = MapOp(pl.col(pl.Int64) * 10).process_frame(frame())
    assert out.column("x").to_pylist() == [0, 10, 20, 30, 40, 50]
    assert out.column(F.ROW).to_pylist() == list(range(6))
    with pytest.raises(ValueError, match="reserved"):
        MapOp(pl.col("x").alias("__lane")).process_frame(frame())


def test_polars_filter_drops_null_predicates():
    out = FilterOp(pl.when(pl.col("x") > 2).then(True)).process_frame(frame())
    assert out.column("x").to_pylist() == [3, 4, 5]


def test_row_map_types_do_not_depend_on_the_frame():
    with pytest.raises(TypeError, match="mixed types"):
        MapOp(lambda p: {**p, "y": 1 if p["x"] else 1.5}).process_frame(frame())
    out = MapOp(lambda p: {**p, "extra": 1} if p["x"] == 3 else p).process_frame(frame())
    assert out.column("extra").to_pylist() == [None, None, None, 1, None, None]


def test_row_map_dropping_every_row_keeps_the_columns():
    out = MapOp(lambda p: None).process_frame(frame())
    assert out.num_rows == 0 and "s" in out.column_names


def test_row_errors_name_the_sample():
    def boom(p):
        if p["x"] == 4:
            raise KeyError("nope")
        return p

    with pytest.raises(KeyError, match=r"row 4\).*KeyError"):
        MapOp(boom).process_frame(frame())
