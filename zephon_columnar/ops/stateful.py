"""``Pipeline.stateful_transform``: user state per lane (`StatefulTransformOp`), and its optional
``transform`` on parallel workers (`RecordsTransformOp`).

Per lane, in stream order, on one thread:

- the lane's state is created lazily by ``init_state()`` on its first rows;
- ``push(state, records) -> (state, outputs)`` is called with the lane's records in windows of
  `WINDOW` (64, Zephon's micro-batch) counted from the flush point, never per frame, so frame
  sizes do not change what ``push`` sees; outputs go on at once;
- after each ``push``, if ``should_flush(state)`` is true, ``flush(state)`` emits and the state
  is created afresh;
- at every flush point and at the end, the partial window is pushed, then ``flush(state)``
  (if given) emits what the state still holds, and the state is created afresh.

Records ``push`` or ``flush`` do not return are simply gone: nothing waits for them, and a
checkpoint does not grow with them. The state is opaque, so a checkpoint resumes by replaying
the flush epoch (`engine.checkpoint`); everything else about resume is exact as for any operator.
``transform(records) -> records`` runs after the ordered part, on the runner's workers, once
per batch of outputs (each ``push``/``flush`` result is one batch).

Example:
    >>> import pyarrow as pa
    >>> from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
    >>> ws = StaticMixtureWorkSource([Dataset.from_tables("toy", [pa.table({"id": [3, 1, 3, 2, 1]})])],
    ...                              {"toy": 1.0}, shuffle_shards=False)
    >>> def first_sightings(seen, records):  # keep a record whose id this lane has not seen yet
    ...     fresh = []
    ...     for r in records:
    ...         if r.payload["id"] not in seen:
    ...             seen.add(r.payload["id"])
    ...             fresh.append(r)
    ...     return seen, fresh
    >>> [r.payload["id"] for r in Pipeline(ws).stateful_transform("dedupe", init_state=set, push=first_sightings)]
    [3, 1, 2]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError, WrongTypeError, operator_failure
from zephon_columnar.ops.accumulators.lane import LaneContext
from zephon_columnar.ops.base import BaseOp, OpTraits, OrderedOp
from zephon_columnar.ops.rows import keep_lineage
from zephon_columnar.records import SampleRecord, frame_of_records, records_of

WINDOW = 64


def _qualname(fn: Any) -> str | None:
    return None if fn is None else getattr(fn, "__qualname__", type(fn).__name__)


class StatefulTransformOp(OrderedOp):
    """The ordered part of ``stateful_transform`` (see the module docstring)."""

    def __init__(
        self,
        name: str,
        *,
        init_state: Callable[[], Any],
        push: Callable[[Any, list[SampleRecord]], tuple[Any, list[SampleRecord]]],
        flush: Callable[[Any], list[SampleRecord]] | None = None,
        should_flush: Callable[[Any], bool] | None = None,
        indexable: bool = False,
        preserves_cursor_order: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(name, str) or not name:
            raise ConfigError(f"stateful_transform(name={name!r}): pass a non-empty name.")
        for what, fn, required in (
            ("init_state", init_state, True),
            ("push", push, True),
            ("flush", flush, False),
            ("should_flush", should_flush, False),
        ):
            if (fn is None and required) or (fn is not None and not callable(fn)):
                raise ConfigError(f"stateful_transform({name!r}): {what} must be a callable, got {fn!r}.")
        self.name = name
        self.init_state = init_state
        self.push = push
        self.flush = flush
        self.should_flush = should_flush
        self.indexable = indexable
        self.preserves_cursor_order = preserves_cursor_order

    def traits(self) -> OpTraits:
        return OpTraits(
            preserves_cursor_order=self.preserves_cursor_order,
            indexable=self.indexable,
            batch_shape_sensitive=True,
            requires_serial_state=True,
        )

    def lane_accumulator(self, ctx: LaneContext | None = None) -> _LaneState:
        return _LaneState(self, ctx or LaneContext())

    def fingerprint(self) -> dict[str, Any]:
        return {
            "op": "stateful_transform",
            "name": self.name,
            "init_state": _qualname(self.init_state),
            "push": _qualname(self.push),
            "flush": _qualname(self.flush),
            "should_flush": _qualname(self.should_flush),
        }


class _LaneState:
    """One lane's state of a `StatefulTransformOp`."""

    def __init__(self, op: StatefulTransformOp, ctx: LaneContext) -> None:
        self.op = op
        self.ctx = ctx
        self.state: Any = None
        self.started = False
        self.window: list[SampleRecord] = []
        # Whether a frame pushed since the last flush point had `__lineage`: the frames this
        # lane emits keep the column then, even when none of their records was cut (`[]` each),
        # so that no delivered row lacks it. Reset at the flush point, where everything pushed
        # since has been emitted, so that replaying the flush epoch after a restore sets it alike.
        self.lineage = False

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as err:
            raise operator_failure(
                err,
                f"stateful_transform({self.op.name!r}): {what} failed on lane "
                f"{self.ctx.lane}: {type(err).__name__}: {err}",
            ) from err

    def _records(self, what: str, out: Any) -> list[SampleRecord]:
        if not isinstance(out, (list, tuple)) or any(not isinstance(r, SampleRecord) for r in out):
            raise WrongTypeError(
                f"stateful_transform({self.op.name!r}): {what} must return a list of SampleRecord "
                f"(the records it lets through, with their meta), got {type(out).__name__}."
            )
        return list(out)

    def _state(self) -> Any:
        if not self.started:
            self.state = self._call("init_state", self.op.init_state)
            self.started = True
        return self.state

    def _push_window(self) -> list[SampleRecord]:
        records, self.window = self.window, []
        result = self._call("push", self.op.push, self._state(), records)
        if not isinstance(result, tuple) or len(result) != 2:
            raise WrongTypeError(
                f"stateful_transform({self.op.name!r}): push must return (new_state, outputs), "
                f"got {type(result).__name__}."
            )
        self.state, out = result
        out = self._records("push", out)
        if self.op.should_flush is not None and self._call("should_flush", self.op.should_flush, self.state):
            out += self._flush_state()
        return out

    def _flush_state(self) -> list[SampleRecord]:
        out = (
            self._records("flush", self._call("flush", self.op.flush, self.state))
            if self.op.flush is not None and self.started
            else []
        )
        self.state, self.started = None, False
        return out

    def _frames(self, batches: list[list[SampleRecord]]) -> list[pa.Table]:
        return [keep_lineage(frame_of_records(b), self.lineage) for b in batches if b]

    def push(self, frame: pa.Table) -> list[pa.Table]:
        self.lineage = self.lineage or F.LINEAGE in frame.column_names
        out = []
        for record in records_of(frame):
            self.window.append(record)
            if len(self.window) == WINDOW:
                out.append(self._push_window())
        return self._frames(out)

    def flush(self, *, reset: bool, end: bool = False) -> list[pa.Table]:
        out = [self._push_window()] if self.window else []
        out.append(self._flush_state())
        frames = self._frames(out)
        self.lineage = False
        return frames

    def carry(self) -> pa.Table | None:
        return None


class RecordsTransformOp(BaseOp):
    """``stateful_transform(transform=...)``: ``transform(records) -> records`` on the runner's
    workers, once per batch the ordered part emitted."""

    builtin = True

    def __init__(
        self, name: str, transform: Callable[[list[SampleRecord]], list[SampleRecord]], parallelism: int
    ) -> None:
        super().__init__()
        if not callable(transform):
            raise ConfigError(f"stateful_transform({name!r}): transform must be a callable, got {transform!r}.")
        self.name = f"{name}.transform"
        self.transform = transform
        self.parallelism = parallelism

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, parallelism=self.parallelism, emits="any")

    def process_many(self, elems: list[SampleRecord]) -> list[SampleRecord]:
        try:
            return self.transform(elems)
        except Exception as err:
            raise operator_failure(
                err, f"stateful_transform({self.name!r}) failed: {type(err).__name__}: {err}"
            ) from err

    def fingerprint(self) -> dict[str, Any]:
        return {"op": "stateful_transform.transform", "name": self.name, "transform": _qualname(self.transform)}
