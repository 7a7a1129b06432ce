"""Torch adapters: the pipeline as a ``torch.utils.data.IterableDataset`` (the stream), or,
for a 1:1 pipeline over a finite source, as a map-style ``Dataset`` (`PipelineMapDataset`).

The pipeline already batches and runs its own workers, so the simplest use is
``DataLoader(ds, batch_size=None, num_workers=0)``; ``ds.state_dict()`` /
``ds.load_state_dict(sd)`` then checkpoint exactly under that plain ``DataLoader``.

With ``num_workers > 0`` each loader worker runs its own engine on a share of this rank's
lanes. As in Zephon, ``active`` = the largest divisor of the lane count that is at most
``num_workers`` workers serve (the others stay idle), worker ``w`` the lanes at positions
``w, w + active, ...``, counted from the lane the rank's round robin serves next. The loader's
own worker round robin then reproduces the rank's order exactly, also after a restore at any
step. Every batch is delivered once.

A plain ``DataLoader`` never tells the dataset which batches the training loop took (its
workers run ahead), so after a worker pass ``ds.state_dict()`` refuses. torchdata's
``StatefulDataLoader`` does tell: each worker's state is its engine's checkpoint, and
``loader.state_dict()`` / ``loader.load_state_dict()`` resume exactly mid-epoch, on the same
data-parallel layout: a worker's state holds its rank's lanes only, and another layout is
refused (for elastic resumes, checkpoint with ``num_workers=0`` or ``Pipeline.checkpoint()``).

Example:
    >>> ds = pipe.to_torch_dataset(return_labels=True)  # doctest: +SKIP
    >>> loader = torch.utils.data.DataLoader(ds, batch_size=None)  # doctest: +SKIP
    >>> for step, tensors in enumerate(loader): ...  # doctest: +SKIP
    >>> ckpt = ds.state_dict()  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import copy
import multiprocessing
import multiprocessing.context
import threading
import time
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch.utils.data

from zephon_columnar import frame as F
from zephon_columnar.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from zephon_columnar.engine.indexed import IndexedPipeline
    from zephon_columnar.pipeline import Pipeline
    from zephon_columnar.records import SampleRecord


class PipelineIterableDataset(torch.utils.data.IterableDataset):
    """Yields the pipeline's items (or ``to_training`` dicts when keyword arguments were given)."""

    def __init__(self, pipeline: "Pipeline", *, stateful: bool = True,
                 to_training: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.stateful = stateful
        self.to_training = dict(to_training) if to_training else None
        # 1 while the latest pass ran in loader workers: set there, read here. Shared memory that
        # the worker processes inherit (the loader hands them this object as they start).
        self._worker_pass: Any = multiprocessing.Value("b", 0, lock=False)
        # in a loader worker: its engine, and the state a StatefulDataLoader restored into it
        self._worker_pipe: "Pipeline | None" = None
        self._worker_lanes: list[int] | None = None
        self._worker_restore: Mapping[str, Any] | None = None

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        if info is None:
            self._mark_worker_pass(False)
            pipe: "Pipeline | None" = self.pipeline
        else:
            self._mark_worker_pass(True)
            exit_after_queue_feeders()
            pipe = self._worker_pipeline(info.id, info.num_workers)
        if pipe is None:
            return  # an idle worker: the lanes do not split that many ways
        for item in pipe:
            yield item.to_training(**self.to_training) if self.to_training is not None else item

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The checkpoint of what was delivered: ``{"pipeline": ...}`` in the main process;
        in a loader worker (torchdata's ``StatefulDataLoader`` asks there), that worker's lanes
        and their checkpoint."""
        if not self.stateful:
            raise ConfigError("state_dict(): this dataset was built with to_torch_dataset(stateful=False).")
        info = torch.utils.data.get_worker_info()
        if info is not None:
            pipe = self._worker_pipeline(info.id, info.num_workers)
            return {"worker": info.id, "lanes": list(self._worker_lanes or []), "rank_lanes": _rank_lanes(self.pipeline),
                    "pipeline": None if pipe is None else pipe._checkpoint(collective=False)}  # noqa: SLF001
        if self._worker_pass is not None and self._worker_pass.value:
            raise ConfigError("state_dict(): the last pass ran in DataLoader worker processes, which read ahead of "
                              "what the training loop took, so this process cannot tell where to resume. Use "
                              "torchdata's StatefulDataLoader (exact with num_workers > 0) or "
                              "DataLoader(num_workers=0): the pipeline runs its own workers.")
        return {"pipeline": self.pipeline.checkpoint()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state_dict()``'s output, before iterating."""
        if not isinstance(state, Mapping) or "pipeline" not in state:
            keys = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise ConfigError(f"load_state_dict(): expected a dict from state_dict() with key 'pipeline', got {keys}.")
        if "lanes" in state:  # one loader worker's state (StatefulDataLoader restores it in that worker)
            if torch.utils.data.get_worker_info() is None:
                raise ConfigError("load_state_dict(): this is one DataLoader worker's state; restore it through "
                                  "the StatefulDataLoader that saved it (loader.load_state_dict).")
            self._worker_restore, self._worker_pipe = state, None
            return
        self.pipeline.restore(state["pipeline"])

    # ---------------------------------------------------------------- workers
    def _mark_worker_pass(self, in_workers: bool) -> None:
        if self._worker_pass is not None:
            self._worker_pass.value = int(in_workers)

    def _worker_pipeline(self, worker: int, workers: int) -> "Pipeline | None":
        """This loader worker's engine over its share of the lanes (built once per worker)."""
        if self._worker_pipe is None:
            restored = self._worker_restore
            if restored is not None:
                _check_worker_state_fits(self.pipeline, restored)
            lanes = list(restored["lanes"]) if restored is not None else worker_lanes(self.pipeline, worker, workers)
            self._worker_lanes = lanes
            if not lanes:
                return None
            pipe = copy.copy(self.pipeline)
            pipe._lane_subset = lanes  # noqa: SLF001
            pipe._run = None  # noqa: SLF001
            if restored is not None and restored["pipeline"] is not None:
                pipe.restore(restored["pipeline"])
            self._worker_pipe = pipe
        return self._worker_pipe

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if multiprocessing.context.get_spawning_popen() is None:
            state["_worker_pass"] = None  # shared memory travels only to processes being started
        state["_worker_pipe"] = None
        return state


# How long a loader worker's exit waits for its result queue to finish sending: below the
# 5 s the main process gives a stopping worker (torch's MP_STATUS_CHECK_INTERVAL).
FEEDER_WAIT_S = 2.0
_feeder_wait_registered = False


def exit_after_queue_feeders() -> None:
    """In a DataLoader worker: make its interpreter exit wait (``FEEDER_WAIT_S`` at most) for
    the result queue's feeder thread. When the loader stops a worker mid-stream (a training
    loop that breaks out, a checkpoint), the worker closes its queue without waiting and exits;
    a batch still being pickled then is in torch's C++ (moving a tensor to shared memory) when
    the interpreter ends the thread, which aborts the worker (SIGABRT, "terminate called without
    an active exception"; the main process raises "DataLoader worker ... killed by signal:
    Aborted"). Waiting at exit, while daemon threads still run, lets the batch go out first.
    Registered once per process."""
    global _feeder_wait_registered
    if not _feeder_wait_registered:
        _feeder_wait_registered = True
        atexit.register(await_queue_feeders, FEEDER_WAIT_S)


def await_queue_feeders(timeout_s: float) -> None:
    """Join this process's ``multiprocessing`` queue feeder threads, ``timeout_s`` in all.

    Example:
        >>> import multiprocessing
        >>> q = multiprocessing.Queue()
        >>> q.put(b"x" * 10); q.close()
        >>> await_queue_feeders(5.0)
        >>> any(t.name == "QueueFeederThread" for t in threading.enumerate())
        False
        >>> q.cancel_join_thread()
    """
    deadline = time.monotonic() + timeout_s
    for thread in threading.enumerate():
        if thread.name == "QueueFeederThread":
            thread.join(max(0.0, deadline - time.monotonic()))


def _rank_lanes(pipe: "Pipeline") -> list[int]:
    from zephon_columnar.engine.lanes import owned_lanes

    o = pipe._options  # noqa: SLF001
    return owned_lanes(canonical_replicas=o.resolved_canonical_replicas(), dp_degree=o.resolved_dp_degree(),
                       dp_group_id=o.resolved_dp_group_id(), mapping=o.resolved_mapping())


def _check_worker_state_fits(pipe: "Pipeline", state: Mapping[str, Any]) -> None:
    """A loader worker's state holds its own lanes only (not the other ranks'): it resumes on
    the data-parallel layout it was saved on. Elsewhere its lanes are not this rank's, and
    going on would deliver another rank's data or stop early: refuse."""
    mine = _rank_lanes(pipe)
    if "rank_lanes" in state:
        saved = [int(lane) for lane in state["rank_lanes"]]
        fits = saved == mine
    else:  # saved before states named their rank's lanes: the worker's own lanes must be this rank's
        saved = [int(lane) for lane in state["lanes"]]
        fits = set(saved) <= set(mine)
    if not fits:
        o = pipe._options  # noqa: SLF001
        raise CheckpointError(
            f"load_state_dict(): this DataLoader worker state was saved by a rank owning lanes {saved}, but under "
            f"options(dp_degree={o.resolved_dp_degree()}, dp_group_id={o.resolved_dp_group_id()}, "
            f"mapping_strategy={o.resolved_mapping()!r}) this rank owns lanes {mine}. A StatefulDataLoader "
            "state taken with num_workers > 0 holds this rank's lanes only, so it resumes on the same "
            "data-parallel layout. To resume on another number of ranks, take the checkpoint with "
            "num_workers=0 (the dataset's state is then the checkpoint merged over every rank) or from "
            "Pipeline.checkpoint().")


def worker_lanes(pipe: "Pipeline", worker: int, workers: int) -> list[int]:
    """The lanes loader worker ``worker`` of ``workers`` serves (see the module docstring).

    Example:
        >>> import pyarrow as pa
        >>> from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
        >>> ds = Dataset.from_tables("a", [pa.table({"x": list(range(8))})])
        >>> pipe = Pipeline(StaticMixtureWorkSource([ds], {"a": 1.0}, chunk_size=2)).options(canonical_replicas=6)
        >>> [worker_lanes(pipe, w, 4) for w in range(4)]  # 3 of the 4 workers serve 2 lanes each
        [[0, 3], [1, 4], [2, 5], []]
    """
    from zephon_columnar.engine.lanes import next_lane

    lanes = _rank_lanes(pipe)
    active = max(d for d in range(1, min(workers, len(lanes)) + 1) if len(lanes) % d == 0)
    if worker >= active:
        return []
    pending = pipe._pending  # noqa: SLF001 - a restored checkpoint: which lane the rank serves next
    first = 0
    if pending is not None:
        first = lanes.index(next_lane(lanes, {lane: pending[lane].items for lane in lanes if lane in pending}))
    rotated = lanes[first:] + lanes[:first]
    return sorted(rotated[worker::active])


class PipelineMapDataset(torch.utils.data.Dataset):
    """``Pipeline.to_indexable_torch_dataset()``: sample ``i`` of a 1:1 pipeline by position.

    ``ds[i]`` is the payload of the sample the stream (one lane) yields ``i``-th, as a dict:
    list-of-number fields (``input_ids``, ``loss_mask``, ...) as 1-D tensors, other fields as
    Python values. ``ds.record(i)`` is the full `SampleRecord` (payload and meta). Stateless:
    the loader's sampler decides the order (``DistributedSampler`` for ranks, its
    ``set_epoch`` for reshuffles), so checkpointing is the sampler's position.

    ``__getitems__`` (which ``DataLoader`` calls with each batch's indices) reads all of a
    batch's rows in one fetch and runs each operator once on them.

    Example:
        >>> loader = torch.utils.data.DataLoader(pipe.to_indexable_torch_dataset(), batch_size=8,
        ...                                      shuffle=True, num_workers=2)  # doctest: +SKIP
    """

    def __init__(self, indexed: "IndexedPipeline") -> None:
        super().__init__()
        self.indexed = indexed

    def __len__(self) -> int:
        return len(self.indexed)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([_position(index)])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        return samples_of(self.indexed.frame([_position(i) for i in indices]), self.indexed.fields)

    def record(self, index: int) -> "SampleRecord":
        """The sample at ``index`` as the stream yields it (payload as Python values, and meta)."""
        return self.indexed.records([_position(index)])[0]

    def close(self) -> None:
        """Release the operators' resources (open files); the next lookup sets them up again."""
        self.indexed.close()


def _position(index: Any) -> int:
    if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
        raise TypeError(f"an indexable dataset takes integer positions, got {type(index).__name__} {index!r:.60}; "
                        "slices and masks are not supported (pass a list of ints to __getitems__).")
    return int(index)


def samples_of(frame: pa.Table, fields: Mapping[int, frozenset[str]] | None = None) -> list[dict[str, Any]]:
    """The payload rows of ``frame`` as dicts: list-of-number columns as 1-D tensors (views
    of one writable copy per column), the others as Python values. With ``fields``
    (``{dataset_id: field names}``), a row leaves out a null field its dataset does not have.

    Example:
        >>> from zephon_columnar import frame as F
        >>> rows = samples_of(F.frame_of({"input_ids": [[1, 2, 3], [4]], "name": ["a", "b"]}))
        >>> rows[0]["input_ids"].tolist(), rows[1]["name"]
        ([1, 2, 3], 'b')
    """
    names = F.payload_names(frame)
    columns = [_column(frame.column(name)) for name in names]
    rows = [dict(zip(names, values)) for values in zip(*columns)] if names else [{} for _ in range(frame.num_rows)]
    if fields:
        datasets = frame.column(F.DATASET).to_pylist()
        foreign = {d: [x for x in names if x not in own] for d, own in fields.items()}
        for row, d in zip(rows, datasets):
            for x in foreign.get(d, ()):
                if row[x] is None:
                    del row[x]
    return rows


def _column(column: pa.ChunkedArray) -> list[Any]:
    arr = column.combine_chunks()
    kind = arr.type
    numeric = (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and (
        pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type)
        or pa.types.is_boolean(kind.value_type))
    values = arr.flatten() if numeric else None
    if values is None or arr.null_count or values.null_count:
        return arr.to_pylist()
    flat = torch.from_numpy(np.array(values.to_numpy(zero_copy_only=False)))  # one writable copy
    return list(torch.split(flat, pc.list_value_length(arr).to_numpy().tolist()))
