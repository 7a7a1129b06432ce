"""Random access to a pipeline: sample ``i`` is position ``i`` of the work source's stream
(`~zephon_columnar.work.positions.SamplePositions`) after the pipeline's operators.

Only pipelines whose operators are 1:1, stateless and order-keeping qualify (fetch, decode,
tokenize without ``split_long_samples``, ``map_transform``, user operators marked
``indexable``): a sample then depends on its own row alone, so it can be computed without the
rows before it. Reordering, filtering, fanning out, packing and batching need the stream;
`indexing_obstacle` names the first operator in the way. A map-style loader does that work
itself (its sampler shuffles and shards, its ``batch_size`` batches).

Lookups are vectorized: ``frame(indices)`` reads all the pointers' rows in one fetch and runs
each operator once on the whole frame. The operators are set up lazily, once per process, so
the object can be pickled into loader workers.

Example:
    >>> from zephon_columnar.engine.spec import PipelineSpec
    >>> from zephon_columnar.io.dataset import Dataset, InMemoryShard
    >>> from zephon_columnar.ops.fetch import FetchOp
    >>> from zephon_columnar.options import RuntimeOptions
    >>> from zephon_columnar.work import StaticMixtureWorkSource
    >>> ds = Dataset.from_dict("toy", {0: InMemoryShard([{"x": i} for i in range(6)])})
    >>> ws = StaticMixtureWorkSource([ds], {"toy": 1.0}, chunk_size=4, shuffle_within_shard=True, seed=3)
    >>> indexed = IndexedPipeline(PipelineSpec(work_source=ws, ops=(FetchOp(),), options=RuntimeOptions()))
    >>> len(indexed), [r.payload["x"] for r in indexed.records([0, 1, 5])]
    (6, [0, 1, 2])
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import cloudpickle
import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.engine.calibrate import prime_token_mixture
from zephon_columnar.engine.engine import fields_by_dataset
from zephon_columnar.engine.runners.stages import run_stage, setup_stages
from zephon_columnar.errors import NotIndexableError, PipelineError
from zephon_columnar.ops.base import BaseOp
from zephon_columnar.ops.batch import BatchOp
from zephon_columnar.ops.fetch import decoded_cache_limit, shard_cache_settings
from zephon_columnar.ops.map import MapBatchOp
from zephon_columnar.ops.user import stages_of
from zephon_columnar.records import SampleRecord, records_of

if TYPE_CHECKING:
    from zephon_columnar.engine.spec import PipelineSpec
    from zephon_columnar.work.base import WorkSource


def indexing_obstacle(ws: WorkSource, ops: Sequence[BaseOp]) -> str | None:
    """Why the pipeline ``ws`` + ``ops`` cannot serve samples by position (None: it can)."""
    supports = getattr(ws, "supports_indexing", None)  # a duck-typed source may not have it
    if supports is None or not supports():
        return (
            f"its work source ({type(ws).__name__}) has no sample positions: supports_indexing() is False "
            "(for a StaticMixtureWorkSource, the stream never ends: bound it with stop_after_passes=N or "
            "max_repeats=N)"
        )
    for op in ops:
        name = op.op_name()
        if isinstance(op, (BatchOp, MapBatchOp)):
            return (
                f"operator {name!r} works on batches; a map-style dataset returns single samples, and "
                "DataLoader(batch_size=..., collate_fn=...) batches them"
            )
        traits = op.traits()
        if not traits.indexable:
            return f"operator {name!r} is not indexable (it is not 1:1 or needs the rows before it)"
        if not traits.preserves_cursor_order:
            return f"operator {name!r} reorders rows"
        if any(stage.is_ordered() for stage in stages_of(op)):
            return (
                f"operator {name!r} keeps state across rows (an ordered stage or a custom accumulator); "
                "an indexed sample is computed from its own row alone"
            )
    return None


class IndexedPipeline:
    """A 1:1 pipeline evaluated at arbitrary positions of its work source's stream.

    ``spec``: the work source (its stream from the start; its own position is not used), the
    operators (fetch first) and the options (the shard cache's settings reach the fetch).

    Raises:
        NotIndexableError: (a ``ValueError`` and a ``RuntimeError``) the pipeline is not indexable
            (`indexing_obstacle` says why).
    """

    def __init__(self, spec: PipelineSpec) -> None:
        ws, ops = spec.work_source, spec.ops
        obstacle = indexing_obstacle(ws, ops)
        if obstacle is not None:
            raise NotIndexableError(
                f"to_indexable_torch_dataset(): the pipeline is not indexable: {obstacle}. "
                "Use to_torch_dataset() for the stream instead."
            )
        prime_token_mixture(ws, ops)
        self._positions = ws.positions()
        self._fields = fields_by_dataset(ws.datasets_by_id) or None
        self._ops = [stage for op in ops for stage in stages_of(op)]
        self._services = {
            "datasets_by_id": ws.datasets_by_id,
            "shard_cache": shard_cache_settings(spec.options),
            "decoded_cache_bytes": decoded_cache_limit(spec.options),
        }
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._ready: tuple[int, list[BaseOp]] | None = None  # (process id, set-up operator copies)

    def __len__(self) -> int:
        return len(self._positions)

    @property
    def fields(self) -> dict[int, frozenset[str]] | None:
        """``{dataset_id: payload field names}`` when datasets differ (see `records_of`)."""
        return self._fields

    def frame(self, indices: Sequence[int] | np.ndarray) -> pa.Table:
        """The frame of the samples at ``indices`` (in that order; repeats allowed).

        Raises:
            IndexError: an index out of range. PipelineError: an operator did not return
            exactly one row per row (a ``map_transform`` returning None, for instance).
        """
        loc = self._positions.locate(indices)
        frame = F.pointer_frame(
            lane=0, chunk_id=loc.chunks, offsets=loc.offsets, pointers=loc.pointers, components=loc.components
        )
        n = frame.num_rows
        with self._lock:
            for op in self._operators():
                frame = run_stage([op], frame)
                if frame.num_rows != n:
                    raise PipelineError(
                        f"operator {op.op_name()!r} returned {frame.num_rows} rows for {n} at positions "
                        f"{np.asarray(indices).reshape(-1)[:8].tolist()}; an indexed pipeline needs exactly one "
                        "sample per position (a map_transform must not return None here)."
                    )
        return frame

    def records(self, indices: Sequence[int] | np.ndarray) -> list[SampleRecord]:
        """The samples at ``indices`` as records (payload and meta, as the stream yields them)."""
        return records_of(self.frame(indices), self._fields)

    def _operators(self) -> list[BaseOp]:
        pid = os.getpid()
        if self._ready is None or self._ready[0] != pid:  # first use in this process
            self._ready = (pid, setup_stages([self._ops], dict(self._services))[0])
        return self._ready[1]

    def close(self) -> None:
        """Tear the operators down (they are set up again on the next lookup)."""
        with self._lock:
            ready, self._ready = self._ready, None
        if ready is not None and ready[0] == os.getpid():
            for op in ready[1]:
                op.teardown()

    def __getstate__(self) -> dict[str, bytes]:
        state = dict(self.__dict__)
        del state["_lock"], state["_ready"]
        # by value (cloudpickle): a map_transform lambda must reach spawned loader workers
        return {"cloudpickled": cloudpickle.dumps(state)}

    def __setstate__(self, state: dict[str, bytes]) -> None:
        self.__dict__.update(cloudpickle.loads(state["cloudpickled"]))
        self._reset()
