"""`MapOp` (``map_transform``) and `FilterOp` (``filter``): stateless row transforms.

Two forms, same contract (a pure function of each row):

- a Polars expression or list of expressions, applied with ``DataFrame.with_columns`` to
  the whole frame at once (the fast path), or, for ``filter``, a boolean Polars expression
  or ``pyarrow.compute.Expression``;
- a Python callable on a payload dict, returning the new payload (``map_transform``; None
  drops the row) or a bool (``filter``) -- correct, and slower.

Example:
    >>> import polars as pl
    >>> pipe = pipe.map_transform(pl.col("text").str.to_lowercase())
    >>> pipe = pipe.filter(pl.col("text").str.len_chars() > 90)
    >>> texts = [record.payload["text"] for record in pipe]
    >>> len(texts), texts[0]
    (4, 'the river carried the fishing boats downstream long before the evening storm reached the hills.')
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError, WrongTypeError, ZephonError, operator_failure
from zephon_columnar.keywords import flag
from zephon_columnar.ops.base import BaseOp, FrameOp, OpTraits
from zephon_columnar.ops.polars_frames import polars_frame
from zephon_columnar.ops.rows import payload_rows, run_payload_fn, sample_of
from zephon_columnar.ops.traits import Emits


def _is_polars_expr(obj: Any) -> bool:
    # Whoever holds a Polars expression has imported polars; no import here keeps it lazy.
    pl = sys.modules.get("polars")
    return pl is not None and isinstance(obj, pl.Expr)


def _is_arrow_expr(obj: Any) -> bool:
    return isinstance(obj, __import__("pyarrow.compute", fromlist=["Expression"]).Expression)


def _root_columns(exprs: list[Any]) -> frozenset[str]:
    """The columns Polars expressions read."""
    return frozenset(name for e in exprs for name in e.meta.root_names())


def _output_columns(exprs: list[Any]) -> frozenset[str] | None:
    """The columns Polars expressions write (None: an expression without one output name,
    such as ``pl.all()``)."""
    try:
        return frozenset(e.meta.output_name() for e in exprs)
    except Exception:  # noqa: BLE001 - polars raises ComputeError for multi-output expressions
        return None


def _describe(fn: Any) -> str:
    if _is_polars_expr(fn) or _is_arrow_expr(fn):
        return str(fn)
    if isinstance(fn, (list, tuple)):
        return "[" + ", ".join(_describe(f) for f in fn) + "]"
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


class MapOp(FrameOp):
    """``map_transform``: Polars expressions or a payload -> payload|None callable."""

    name = "map_transform"

    def __init__(self, fn: Any, *, parallelism: int | None = None, drop_none: bool = True) -> None:
        super().__init__()
        exprs = list(fn) if isinstance(fn, (list, tuple)) else [fn]
        self.is_expr = all(_is_polars_expr(e) for e in exprs)
        if not self.is_expr and not (len(exprs) == 1 and callable(exprs[0])):
            raise ConfigError(
                f"map_transform: got {_describe(fn)}; pass a callable (payload dict -> dict or None) "
                "or a Polars expression / list of Polars expressions."
            )
        self.fn: Any = exprs if self.is_expr else exprs[0]  # the expressions, or the one callable
        self.parallelism = parallelism
        self.drop_none = flag("map_transform", "drop_none", drop_none)

    def traits(self) -> OpTraits:
        # A callable's None drops its row (unless drop_none=False); expressions map every row.
        emits: Emits = "at_most_one" if self.drop_none and not self.is_expr else "one"
        return OpTraits(
            preserves_cursor_order=True,
            parallelism=self.parallelism or 1,
            emits=emits,
            reads=_root_columns(self.fn) if self.is_expr else None,
            writes=_output_columns(self.fn) if self.is_expr else None,
        )

    def fingerprint(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.name, "fn": _describe(self.fn)}
        if not self.drop_none and not self.is_expr:
            out["drop_none"] = False
        return out

    def process_frame(self, frame: pa.Table) -> pa.Table:
        if not self.is_expr:
            return run_payload_fn(frame, self.fn, op_name=_describe(self.fn), drop_none=self.drop_none)
        # Expressions see the payload only: pl.all() or a dtype selector must not rewrite the
        # bookkeeping that replay and sample ids depend on.
        payload = polars_frame(F.payload_of(frame))
        try:
            out = payload.with_columns(self.fn).to_arrow()
        except Exception as err:  # polars raises many types; name the expression
            raise operator_failure(
                err, f"map_transform expression {_describe(self.fn)} failed: {type(err).__name__}: {err}"
            ) from err
        reserved = [c for c in out.column_names if F.is_bookkeeping(c)]
        if reserved:
            raise ConfigError(
                f"map_transform expression {_describe(self.fn)} writes {reserved}; names "
                "starting with '__' are reserved for the engine, pick another name."
            )
        return F.with_payload(F.bookkeeping_of(frame), out)


class FilterOp(FrameOp):
    """``filter``: keep the rows where a predicate holds (Polars/pyarrow expression or callable)."""

    name = "filter"

    def __init__(self, predicate: Any, *, parallelism: int | None = None) -> None:
        super().__init__()
        if not (_is_polars_expr(predicate) or _is_arrow_expr(predicate) or callable(predicate)):
            raise ConfigError(
                f"filter: got {type(predicate).__name__}; pass a boolean Polars expression, a "
                "pyarrow.compute.Expression, or a callable payload dict -> bool."
            )
        self.predicate = predicate
        self.parallelism = parallelism

    def traits(self) -> OpTraits:
        # not indexable: a dropped row leaves its position without a sample
        return OpTraits(
            preserves_cursor_order=True,
            indexable=False,
            parallelism=self.parallelism or 1,
            emits="at_most_one",
            reads=_root_columns([self.predicate]) if _is_polars_expr(self.predicate) else None,
            writes=frozenset(),
        )

    def fingerprint(self) -> dict[str, Any]:
        return {"op": self.name, "predicate": _describe(self.predicate)}

    def keeps_null_row(self, columns: pa.Schema) -> bool | None:
        """Whether a row whose ``columns`` are null passes (`~zephon_columnar.ops.traits.KeepsRows`):
        a Polars predicate is evaluated on one such row; None for other predicates, or when it
        cannot be evaluated there.

        Example:
            >>> import polars as pl, pyarrow as pa
            >>> schema = pa.schema([("text", pa.string())])
            >>> FilterOp(pl.col("text").str.len_chars() > 3).keeps_null_row(schema)
            False
            >>> FilterOp(pl.col("text").fill_null("a long default").str.len_chars() > 3).keeps_null_row(schema)
            True
        """
        if not _is_polars_expr(self.predicate):
            return None
        row = pa.table({f.name: pa.nulls(1, f.type) for f in columns})
        try:
            kept = polars_frame(row).select(self.predicate.fill_null(False)).to_series().to_list()
        except Exception:  # noqa: BLE001 - a predicate that needs more than these columns: cannot tell
            return None
        return bool(kept[0]) if len(kept) == 1 else None

    def process_frame(self, frame: pa.Table) -> pa.Table:
        pred = self.predicate
        try:
            if _is_polars_expr(pred):
                # A null predicate drops the row, as Polars' own filter does.
                mask = polars_frame(F.payload_of(frame)).select(pred.fill_null(False)).to_series().to_numpy()
            elif _is_arrow_expr(pred):
                return frame.filter(pred)
            else:
                mask = np.fromiter(
                    (_row_predicate(pred, frame, i, r) for i, r in enumerate(payload_rows(frame))),
                    dtype=bool,
                    count=frame.num_rows,
                )
        except ZephonError:
            raise
        except Exception as err:
            raise operator_failure(
                err, f"filter predicate {_describe(pred)} failed: {type(err).__name__}: {err}"
            ) from err
        if mask.dtype != np.bool_:
            raise WrongTypeError(f"filter predicate {_describe(pred)} gave {mask.dtype} values, not booleans.")
        return frame.filter(pa.array(mask))


def _row_predicate(pred: Callable[[dict[str, Any]], Any], frame: pa.Table, i: int, row: dict[str, Any]) -> bool:
    try:
        return bool(pred(row))
    except Exception as err:
        raise operator_failure(
            err, f"filter predicate {_describe(pred)} failed on {sample_of(frame, i)}: {type(err).__name__}: {err}"
        ) from err


class MaterializeOp(FrameOp):
    """``materialize``: a 1:1 pass-through that makes each frame's columns contiguous."""

    name = "materialize"

    def __init__(self, parallelism: int | None = None) -> None:
        super().__init__()
        self.parallelism = parallelism

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, parallelism=self.parallelism or 1, emits="one")

    def process_frame(self, frame: pa.Table) -> pa.Table:
        return frame.combine_chunks()


class MapBatchOp(BaseOp):
    """``map_batch``: ``fn(SampleBatch) -> SampleBatch | None`` on each batch a lane delivers
    (after ``batch``). None drops the batch (``drop_none=False``: delivers it unchanged).
    Runs in the thread that iterates the pipeline, on delivered batches, so it sees batches
    in delivery order and a checkpoint counts a dropped batch as delivered."""

    name = "map_batch"
    builtin = True

    def __init__(self, fn: Callable[[Any], Any], *, drop_none: bool = True) -> None:
        super().__init__()
        if not callable(fn):
            raise ConfigError(f"map_batch: got {type(fn).__name__}; pass a callable SampleBatch -> SampleBatch | None.")
        self.fn = fn
        self.drop_none = flag("map_batch", "drop_none", drop_none)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, indexable=False, emits="at_most_one")

    def apply(self, batch: Any) -> Any:
        """The batch to deliver instead of ``batch``, or None to drop it."""
        from zephon_columnar.types import SampleBatch

        try:
            out = self.fn(batch)
        except Exception as err:
            raise operator_failure(
                err,
                f"map_batch function {_describe(self.fn)} failed on a batch of lane "
                f"{batch.lane_id}: {type(err).__name__}: {err}",
            ) from err
        if out is None:
            return None if self.drop_none else batch
        if not isinstance(out, SampleBatch):
            raise WrongTypeError(
                f"map_batch function {_describe(self.fn)} returned {type(out).__name__}; return a "
                "SampleBatch (e.g. SampleBatch(records)), or None to drop the batch."
            )
        return out

    def process_many(self, elems: list[Any]) -> list[Any]:
        from zephon_columnar.types import SampleBatch

        out = []
        for e in elems:
            got = self.apply(e) if isinstance(e, SampleBatch) else e
            if got is not None:
                out.append(got)
        return out

    def fingerprint(self) -> dict[str, Any]:
        return {"op": self.name, "fn": _describe(self.fn), "drop_none": self.drop_none}
