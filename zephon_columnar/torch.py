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
``StatefulDataLoader`` does tell: each worker's state is a `WorkerState` (its lanes and their
checkpoint), and ``loader.state_dict()`` / ``loader.load_state_dict()`` resume exactly mid-epoch.

A worker's state holds its own lanes only. To resume on another layout (checkpoint on 8 ranks
with 4 workers each, resume on 4 ranks with 2), build the loader with
``pipe.to_torch_loader(num_workers=...)``: its ``state_dict()`` also carries every lane's
checkpoint at that step (`PipelineLoaderState`: the workers' parts merged, then every rank's
through the ``torch.distributed`` group or ``options(aggregate_dir=...)``, so every rank calls it
at the same step, as with any data-parallel checkpoint), and it resumes on any number of ranks
and workers. A ``StatefulDataLoader`` built over ``to_torch_dataset()`` by hand resumes on
another number of ranks (the same number of workers) through ``aggregate_dir`` only, where each
worker keeps its snapshots (`zephon_columnar.engine.checkpoint.loader` says how both forms find
every lane).

Example:
    >>> pipe = pipe.tokenize(tokenizer_id="tok/", field="text", special_tokens="eos")
    >>> pipe = pipe.pack_flat(65, algorithm="wrap").batch(4)
    >>> ds = pipe.to_torch_dataset(return_labels=True)
    >>> loader = torch.utils.data.DataLoader(ds, batch_size=None)
    >>> for step, tensors in enumerate(loader):
    ...     if step == 1:
    ...         ckpt = ds.state_dict()  # torch.save it; load_state_dict(ckpt) resumes after step 1
    >>> step, tensors["input_ids"].shape, tensors["labels"].shape
    (2, torch.Size([4, 64]), torch.Size([4, 64]))
"""

from __future__ import annotations

import ast
import atexit
import functools
import hashlib
import json
import multiprocessing
import multiprocessing.context
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NoReturn, cast, get_args

import cloudpickle
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch.utils.data
from torch.utils.data._utils.collate import default_collate_fn_map

from zephon_columnar import frame as F
from zephon_columnar.device import Checkpointable, DeviceLoader
from zephon_columnar.engine.checkpoint import load_checkpoint, parse_checkpoint
from zephon_columnar.engine.checkpoint.loader import (
    LOADER_STATE_KEY,
    MAX_LOADER_WORKERS,
    CutExchange,
    LoaderLayout,
    LoaderPhase,
    LoaderState,
    WorkerState,
    active_workers,
    is_worker_state,
    loader_cut,
    loader_state_from_json,
    loader_state_to_json,
    rank_part,
    read_loader_parts,
    worker_lanes,
    worker_state_from_json,
    worker_state_to_json,
    write_loader_part,
)
from zephon_columnar.engine.pass_report import PassReport
from zephon_columnar.errors import CheckpointError, ConfigError
from zephon_columnar.losses import say
from zephon_columnar.ops.config import LoaderKind
from zephon_columnar.progress import SharedCounts, Tally, report_shared
from zephon_columnar.training import TrainingOptions
from zephon_columnar.types import SampleBatch
from zephon_columnar.work.schedule import MixtureChange

if TYPE_CHECKING:
    from zephon_columnar.engine.indexed import IndexedPipeline
    from zephon_columnar.records import SampleRecord
    from zephon_columnar.session import Session


class LoaderBatch(dict[str, Any]):
    """One batch's training tensors, as ``SampleBatch.to_training`` makes them: what a loader
    over the pipeline yields (a ``dict``). Its own type so that torch's default collate, which
    would stack it under a new leading dimension (``DataLoader``'s default ``batch_size=1``),
    stops with an error that says what to pass instead.
    """

    __slots__ = ()


def _refuse_collate(batch: Sequence[Any], *, collate_fn_map: Any = None) -> NoReturn:
    kind = type(batch[0]).__name__
    raise TypeError(
        f"DataLoader is collating {len(batch)} {kind}(s) into a new batch, but the pipeline makes "
        "whole batches already (its batch()): torch's default batch_size=1 would add a leading "
        "dimension. Pass DataLoader(dataset, batch_size=None), or build the loader with "
        "pipe.to_torch_loader(...), which does."
    )


# The pipeline's own batch types are never collated again (torch documents extending
# default_collate through this map): the types are ours, nothing else changes.
default_collate_fn_map.update({LoaderBatch: _refuse_collate, SampleBatch: _refuse_collate})


def build_loader(
    dataset: PipelineIterableDataset,
    *,
    loader: LoaderKind = "auto",
    num_workers: int = 0,
    multiprocessing_context: str | None = "spawn",
    timeout: float = 0,
    pin_memory: bool = False,
    prefetch: int | None = None,
) -> torch.utils.data.DataLoader[Any] | DeviceLoader:
    """The loader `Pipeline.to_torch_loader` returns: ``batch_size=None`` (the pipeline batches),
    ``num_workers`` workers started by ``multiprocessing_context`` (ignored without workers);
    with a to_training ``device``, inside a `DeviceLoader` that moves each batch there
    (``prefetch`` batches ahead, default 2)."""
    device = None if dataset.to_training is None else dataset.to_training.device
    if device is None and prefetch is not None:
        raise ConfigError(
            f"to_torch_loader(prefetch={prefetch!r}) is how many batches cross to the device ahead of "
            "the trainer; pass device= too (for example device='cuda')."
        )
    if device is not None and pin_memory:
        raise ConfigError(
            f"to_torch_loader(device={device!r}) stages batches in pinned memory itself; drop pin_memory=True."
        )
    if loader not in get_args(LoaderKind):
        raise ConfigError(f"to_torch_loader(loader={loader!r}): use one of {list(get_args(LoaderKind))}.")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ConfigError(f"to_torch_loader(num_workers={num_workers!r}): pass an int >= 0.")
    cls: type[torch.utils.data.DataLoader[Any]] = torch.utils.data.DataLoader
    if loader != "plain":
        try:
            from torchdata.stateful_dataloader import StatefulDataLoader
        except ImportError:
            if loader == "stateful":
                raise ImportError(
                    "to_torch_loader(loader='stateful') needs torchdata's StatefulDataLoader: pip install "
                    "torchdata, or pass loader='plain' (checkpoint then through loader.dataset.state_dict(), "
                    "with num_workers=0)."
                ) from None
        else:
            cls = StatefulDataLoader
    context = multiprocessing_context if num_workers > 0 else None
    if context is not None:
        check_main_module_guarded(context, num_workers)
    if num_workers > 0:
        dataset.open_worker_reports(
            multiprocessing.get_context(context) if isinstance(context, str) or context is None else context
        )
    stateful = cls is not torch.utils.data.DataLoader
    dataset.completed_by_loader = stateful
    if stateful or num_workers > 0:
        cls = _pipeline_loader(cls)
    built = cls(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        multiprocessing_context=context,
        timeout=timeout,
        pin_memory=pin_memory,
    )
    if dataset.to_training is None or device is None:
        return built
    dataset.on_host = True  # the DeviceLoader moves each batch, in this process
    checkpoints: Checkpointable | None = None  # a plain DataLoader with workers cannot checkpoint
    if stateful:
        checkpoints = cast("Checkpointable", built)  # torchdata's StatefulDataLoader
    elif num_workers == 0:
        checkpoints = dataset
    return DeviceLoader(
        built, dataset.to_training.transfer, prefetch=2 if prefetch is None else prefetch, checkpoints=checkpoints
    )


_PIPELINE_LOADERS: dict[type, type] = {}


def _pipeline_loader(base: type[torch.utils.data.DataLoader[Any]]) -> type[torch.utils.data.DataLoader[Any]]:
    """``base`` (torch's DataLoader or torchdata's StatefulDataLoader) as `build_loader` makes
    it: same name, same behaviour, but that its passes end by saying once, in this process, what
    the loader workers' passes dropped (`PipelineIterableDataset.say_worker_losses`), and that a
    stateful one's state carries the checkpoint of every lane (`PipelineLoaderState`)."""

    def __iter__(self: Any) -> Iterator[Any]:
        self.dataset.next_pass()
        iterator = _ReportingIterator(base.__iter__(self), self.dataset, restart=lambda: base.__iter__(self))
        self._live_iterator = weakref.ref(iterator)
        return iterator

    if base not in _PIPELINE_LOADERS:
        namespace = {"__iter__": __iter__, "__module__": base.__module__, "__doc__": base.__doc__}
        bases = (base,) if base is torch.utils.data.DataLoader else (PipelineLoaderState, base)
        _PIPELINE_LOADERS[base] = type(base.__name__, bases, namespace)
    return _PIPELINE_LOADERS[base]


class PipelineLoaderState:
    """The state methods of a stateful loader built by ``to_torch_loader`` (torchdata's
    ``StatefulDataLoader`` over a `PipelineIterableDataset`): its ``state_dict()`` is
    torchdata's, plus a `LoaderState` under `LOADER_STATE_KEY` that holds every lane's checkpoint
    at the step it was taken (its workers' parts merged, then every rank's through the
    ``torch.distributed`` group or ``aggregate_dir``: a collective, at the step the trainer
    checkpoints). ``load_state_dict()`` gives each worker its own state back on the layout it
    was saved on (the same lanes, the same number of workers), and on any other layout starts
    a fresh loader from that checkpoint, its workers splitting this rank's lanes anew."""

    num_workers: int
    dataset: PipelineIterableDataset
    _live_iterator: weakref.ref[_ReportingIterator] | None = None  # the open pass (set by __iter__)

    def state_dict(self) -> dict[str, Any]:
        return self.completed(self.position())

    def position(self) -> dict[str, Any]:
        """torchdata's state after the last batch taken: at once, no collective (what a
        `DeviceLoader` records with each batch it takes)."""
        state: dict[str, Any] = cast("Any", super()).state_dict()  # the StatefulDataLoader's
        return state

    def completed(self, position: Mapping[str, Any]) -> dict[str, Any]:
        """``position`` with every lane's checkpoint at its step (a collective across ranks)."""
        dataset = self.dataset
        if "_snapshot" not in position:  # no workers: the dataset's own state, in this process
            own = position.get("dataset_state")
            return dict(position, dataset_state=None if own is None else dataset.completed(own))
        snapshots = position["_snapshot"]["_worker_snapshots"].values()
        states = sorted(
            (worker_state_from_json(s["dataset_state"]) for s in snapshots if s.get("dataset_state") is not None),
            key=lambda state: state.worker,
        )
        if len(states) != self.num_workers:
            states = []  # before the workers' first states: where the next pass starts
        whole = dataset.loader_state(states, self.num_workers)
        return dict(position, **{LOADER_STATE_KEY: loader_state_to_json(whole)})

    def set_mixture(self, weights: Mapping[str, float], *, at_state: Mapping[str, Any] | None = None) -> MixtureChange:
        """`Pipeline.set_mixture` between two batches of this loader: where the change takes
        effect follows from every lane's state at the trainer's step (this loader's `state_dict`,
        a collective across ranks; ``at_state``: that state, taken by a `DeviceLoader` for the
        batch its trainer holds); the workers restart there, under the changed mixture, and the
        open iteration goes on with the batch the pass would have given had the change always
        been part of it."""
        dataset = self.dataset
        state = self.state_dict() if at_state is None else at_state
        if LOADER_STATE_KEY not in state:  # no workers: the pass runs in this process
            own = state.get("dataset_state")
            return dataset.set_mixture(weights, at_state=own if isinstance(own, Mapping) else None)
        checkpoint = loader_state_from_json(state[LOADER_STATE_KEY]).checkpoint
        dataset.load_state_dict({"pipeline": checkpoint})  # the workers restart there...
        change = dataset.session.set_mixture(weights, delivered=parse_checkpoint(checkpoint).lanes)  # ...changed
        iterator = self._live_iterator() if self._live_iterator is not None else None
        if iterator is not None:
            iterator.restart()
        return change

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        dataset = self.dataset
        saved_workers = int(state["_snapshot"]["_main_snapshot"]["_num_workers"]) if "_snapshot" in state else 0
        checkpoint: Mapping[str, Any] | None = None
        if LOADER_STATE_KEY in state:
            saved = loader_state_from_json(state[LOADER_STATE_KEY])
            layout = saved.layout
            same = layout.workers == self.num_workers and layout.rank_lanes == tuple(dataset.session.rank_lanes())
            checkpoint = saved.checkpoint
        else:  # saved by a loader over to_torch_dataset(), or before loader states were whole
            same = saved_workers == self.num_workers
            own = state.get("dataset_state") if saved_workers == 0 else None
            checkpoint = own.get("pipeline") if isinstance(own, Mapping) else None
        if same:  # each worker its own state back
            cast("Any", super()).load_state_dict({k: v for k, v in state.items() if k != LOADER_STATE_KEY})
        elif checkpoint is None:
            raise CheckpointError(
                f"load_state_dict(): this state was saved by a StatefulDataLoader with num_workers={saved_workers} "
                "over to_torch_dataset(); each of its workers' states holds that worker's lanes only, so it resumes "
                f"with num_workers={saved_workers}, not {self.num_workers}. A loader built with "
                "pipe.to_torch_loader(num_workers=...) saves every lane and resumes with any number of workers."
            )
        else:  # another layout: a fresh loader from every lane's checkpoint
            dataset.load_state_dict({"pipeline": checkpoint})


class _ReportingIterator:
    """A loader's iterator that, when its pass ends, has the dataset say the workers' losses;
    `restart` goes on with a fresh iterator of the loader (new workers, from the state the
    dataset was given: `PipelineLoaderState.set_mixture`)."""

    def __init__(
        self, inner: Iterator[Any], dataset: PipelineIterableDataset, *, restart: Callable[[], Iterator[Any]]
    ) -> None:
        self._inner = inner
        self._dataset = dataset
        self._fresh = restart

    def restart(self) -> None:
        self._inner = iter(())  # the old workers stop as their iterator goes
        self._dataset.next_pass()
        self._inner = self._fresh()

    def __iter__(self) -> _ReportingIterator:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._inner)
        except StopIteration:
            self._dataset.say_worker_losses()
            raise


def check_main_module_guarded(context: str | multiprocessing.context.BaseContext, workers: int) -> None:
    """Refuse workers started by ``spawn`` or ``forkserver`` when the main script has no
    ``if __name__ == "__main__":`` block: each worker runs that script again from the top, so it
    would build a loader and start workers of its own; Python then stops the worker, and while it
    writes a large pipeline to the dying worker the parent waits forever."""
    method = context if isinstance(context, str) else context.get_start_method()
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if method == "fork" or main_file is None or _has_main_guard(main_file):
        return
    raise RuntimeError(
        f"to_torch_loader(num_workers={workers}) starts its workers with {method!r}, which runs "
        f"{main_file} again in each worker, and that script has no 'if __name__ == \"__main__\":' "
        "block: every worker would start workers of its own. Put the training code under that "
        "block (the multiprocessing documentation's 'Safe importing of main module')."
    )


@functools.cache
def _has_main_guard(path: str) -> bool:
    """Whether the module at ``path`` has a top-level ``if __name__ == "__main__":`` (True when it
    cannot be read: then there is nothing to say)."""
    try:
        with open(path, encoding="utf-8") as source:
            tree = ast.parse(source.read(), filename=path)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return True
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.comparators) == 1:
            sides = [node.test.left, node.test.comparators[0]]
            names = {s.id for s in sides if isinstance(s, ast.Name)}
            constants = {s.value for s in sides if isinstance(s, ast.Constant)}
            if names == {"__name__"} and constants == {"__main__"}:
                return True
    return False


class PipelineIterableDataset(torch.utils.data.IterableDataset[Any]):
    """Yields the pipeline's batches, or their training tensors (a `LoaderBatch`) when
    ``to_training`` options are given."""

    def __init__(self, session: Session, *, stateful: bool = True, to_training: TrainingOptions | None = None) -> None:
        super().__init__()
        self.session = session
        self.stateful = stateful
        self.to_training = to_training
        # True when a DeviceLoader moves the tensors to the device (to_training stops on the host)
        self.on_host = False
        # 1 while the latest pass ran in loader workers: set there, read here. Shared memory that
        # the worker processes inherit (the loader hands them this object as they start).
        self._worker_pass: Any = multiprocessing.Value("b", 0, lock=False)
        # Per loader worker, (generation, delivered, position) in one word (`_cut_word`): how the
        # workers of one rank resuming on another layout tell each other which snapshot each has.
        self._cut_slots: Any = multiprocessing.Array("q", MAX_LOADER_WORKERS, lock=False)
        # Per loader worker, its progress counts (show_progress): the trainer process shows their
        # sum, one readout, from a thread started as the workers start (`_start_progress`).
        self._components = len(session.mixture_components())
        self._progress_slots: Any = multiprocessing.Array(
            "q", SharedCounts.slots(MAX_LOADER_WORKERS, self._components), lock=False
        )
        self._progress_thread: threading.Thread | None = None
        # What each loader worker's pass dropped (its run's PassReport), to say once in the
        # trainer process with the rank's totals (`say_worker_losses`): a queue of the loader's
        # multiprocessing context, opened by `build_loader` (None: the workers say their own).
        self._reports: Any = None
        self._pass_token = 0  # which pass of the loader a report belongs to
        # in a loader worker: its engine, and the state a StatefulDataLoader restored into it
        self._worker_session: Session | None = None
        self._worker_lanes: list[int] | None = None
        self._worker_restore: WorkerState | None = None
        # True under a stateful loader built by to_torch_loader: torchdata asks this dataset for
        # its state after every batch, and the loader's own state_dict() merges the ranks' parts
        # once, when the trainer asks (`PipelineLoader`), instead of at every batch.
        self.completed_by_loader = False
        self._phase: LoaderPhase | None = None
        self._start = "fresh"  # or the digest of the checkpoint load_state_dict restored

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        if info is None:
            self._mark_worker_pass(False)
            session: Session | None = self.session
        else:
            self._mark_worker_pass(True)
            exit_after_queue_feeders()
            if self.to_training is not None and self.to_training.device is not None and not self.on_host:
                raise ConfigError(
                    f"to_training(device={self.to_training.device!r}) in a DataLoader worker would start the "
                    "device there; build the loader with pipe.to_torch_loader(num_workers=..., device=...), "
                    "which moves each batch in the training process."
                )
            session = self._worker_session_of(info.id, info.num_workers)
        if session is None:
            return  # an idle worker: the lanes do not split that many ways
        count: Callable[[Any], None] | None = None  # a worker's progress, into its shared slot
        if info is not None and self.session.shows_progress:
            shared, worker = SharedCounts(self._progress_slots, components=self._components), info.id
            tally = Tally(chunk_size=session.stream_shape().chunk_size, components=self._components)

            def count(item: Any) -> None:
                shared.put(worker, tally.add(item))

        for item in session:
            if count is not None:
                count(item)
            if self._phase is not None:
                self._phase = replace(self._phase, delivered=self._phase.delivered + 1)
            if self.to_training is None:
                yield item
            else:
                yield LoaderBatch(item.to_training_with(self.to_training, on_host=self.on_host))
        report = session.run.pass_report() if session.run is not None else None
        if info is not None and self._reports is not None and report is not None:
            self._reports.put((self._pass_token, cloudpickle.dumps(report)))  # before torch hears the end

    def set_epoch(self, epoch: int) -> None:
        """The pipeline's `~zephon_columnar.pipeline.Pipeline.set_epoch`, for the next pass
        (``loader.dataset.set_epoch(e)`` before ``iter(loader)``: workers start with it)."""
        self.session.set_epoch(epoch)

    def set_mixture(self, weights: Mapping[str, float], *, at_state: Mapping[str, Any] | None = None) -> MixtureChange:
        """The pipeline's `~zephon_columnar.pipeline.Pipeline.set_mixture`, between two batches
        of a loader without workers (``num_workers=0``), whose pass goes on from the change;
        ``at_state``: this dataset's `state_dict` at the trainer's step, when batches were taken
        ahead of it (a `DeviceLoader`): the pass restarts there."""
        if self._worker_pass.value:
            raise RuntimeError(
                "set_mixture(): the pass runs in DataLoader workers, which the dataset cannot restart at the "
                "trainer's step; call set_mixture on the loader pipe.to_torch_loader(num_workers=...) built (it "
                "restarts its workers there), or iterate with num_workers=0."
            )
        if at_state is None:
            return self.session.set_mixture(weights)
        pipeline = load_checkpoint(at_state["pipeline"])
        return self.session.set_mixture(weights, delivered=parse_checkpoint(pipeline).lanes)

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The checkpoint of what was delivered: ``{"pipeline": ...}`` in the main process
        (merged across ranks, `Session.gathered`); in a loader worker (torchdata's
        ``StatefulDataLoader`` asks there), that worker's `WorkerState`."""
        if not self.stateful:
            raise ConfigError("state_dict(): this dataset was built with to_torch_dataset(stateful=False).")
        info = torch.utils.data.get_worker_info()
        if info is not None:
            return worker_state_to_json(self._worker_state(info.id, info.num_workers))
        position = self.position()
        return position if self.completed_by_loader else self.completed(position)

    def position(self) -> dict[str, Any]:
        """This rank's checkpoint after the last item taken, at once and without a collective:
        what a `DeviceLoader` records with each batch it takes (`completed` makes it whole)."""
        if self._worker_pass is not None and self._worker_pass.value:
            raise ConfigError(
                "state_dict(): the last pass ran in DataLoader worker processes, which read ahead of "
                "what the training loop took, so this process cannot tell where to resume. Use "
                "torchdata's StatefulDataLoader (exact with num_workers > 0) or "
                "DataLoader(num_workers=0): the pipeline runs its own workers."
            )
        return {"pipeline": self.session.checkpoint(collective=False)}

    def completed(self, position: Mapping[str, Any]) -> dict[str, Any]:
        """The state of `position`'s output, merged with every rank's part of the same step (a
        collective where there are several data-parallel ranks)."""
        return {"pipeline": self.session.gathered(dict(position["pipeline"]))}

    def loader_state(self, workers: Sequence[WorkerState], num_workers: int) -> LoaderState:
        """What a stateful loader over this dataset with ``num_workers`` workers records beside
        torchdata's state: the checkpoint of every lane at the step of its workers' latest
        states ``workers`` (none yet: where the next pass starts), gathered across ranks."""
        part = rank_part(workers) if workers else self.session.checkpoint(collective=False)
        o = self.session.spec.settled().options
        layout = LoaderLayout(
            workers=num_workers,
            rank_lanes=tuple(self.session.rank_lanes()),
            dp_degree=o.resolved_dp_degree(),
            dp_group_id=o.resolved_dp_group_id(),
        )
        return LoaderState(layout=layout, checkpoint=self.session.gathered(part))

    def _worker_state(self, worker: int, workers: int) -> WorkerState:
        session = self._worker_session_of(worker, workers)
        ckpt = None if session is None else session.checkpoint(collective=False)
        o = self.session.spec.settled().options
        phase = self._phase
        if ckpt is not None and phase is not None and o.aggregate_dir:
            write_loader_part(
                ckpt,
                directory=o.aggregate_dir,
                run_id=o.run_id,
                phase=phase.name,
                group=o.resolved_dp_group_id(),
                worker=worker,
                delivered=phase.delivered,
            )
        return WorkerState(
            worker=worker,
            lanes=tuple(self._worker_lanes or ()),
            rank_lanes=tuple(self.session.rank_lanes()),
            pipeline=ckpt,
            phase=phase,
            dp_degree=o.resolved_dp_degree(),
            run_id=o.run_id,
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state_dict()``'s output, before iterating."""
        if is_worker_state(state):  # one loader worker's state (StatefulDataLoader restores it in that worker)
            if torch.utils.data.get_worker_info() is None:
                raise ConfigError(
                    "load_state_dict(): this is one DataLoader worker's state; restore it through "
                    "the StatefulDataLoader that saved it (loader.load_state_dict)."
                )
            self._worker_restore, self._worker_session, self._worker_lanes = worker_state_from_json(state), None, None
            return
        if not isinstance(state, Mapping) or "pipeline" not in state:
            keys = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise ConfigError(f"load_state_dict(): expected a dict from state_dict() with key 'pipeline', got {keys}.")
        self.session.restore(state["pipeline"])
        # Where loader workers start from: part of their phase's name (`_new_phase`).
        self._start = hashlib.sha256(
            json.dumps(load_checkpoint(state["pipeline"]), sort_keys=True).encode()
        ).hexdigest()

    # ---------------------------------------------------------------- workers
    def _mark_worker_pass(self, in_workers: bool) -> None:
        if self._worker_pass is not None:
            self._worker_pass.value = int(in_workers)

    def _worker_session_of(self, worker: int, workers: int) -> Session | None:
        """This loader worker's engine over its share of the lanes (None: an idle worker).
        Decided once per worker (a resume on another layout meets the rank's other workers
        once)."""
        if self._worker_lanes is None:
            restored = self._worker_restore
            ckpt: Mapping[str, Any] | None = None
            if restored is None:
                lanes = self._lanes_of(worker, workers, first_worker=0)
                self._phase = self._new_phase(self._start, worker, workers, first=0, serving=bool(lanes))
            elif restored.fits(self.session.rank_lanes()):
                lanes, ckpt, self._phase = list(restored.lanes), restored.pipeline, restored.phase
            else:
                lanes, ckpt, self._phase = self._resume_elsewhere(restored, worker, workers)
            self._worker_lanes = lanes
            if not lanes:
                return None
            share = self.session.for_lanes(lanes)
            share.show_progress(None)  # the trainer process shows the workers' counts together
            share.says_losses = self._reports is None  # else the trainer says them, for the rank
            if ckpt is not None:
                share.restore(ckpt)
            self._worker_session = share
        return self._worker_session

    def _lanes_of(
        self, worker: int, workers: int, *, first_worker: int, emitted: Mapping[int, int] | None = None
    ) -> list[int]:
        """`worker_lanes` of this rank, counted from the lane it serves next (by ``emitted``,
        items per lane; default: the restored checkpoint's)."""
        if emitted is None:
            pending = self.session.pending
            emitted = {} if pending is None else {lane: state.items for lane, state in pending.items()}
        return worker_lanes(self.session.rank_lanes(), worker, workers, first_worker=first_worker, emitted=emitted)

    def _resume_elsewhere(
        self, restored: WorkerState, worker: int, workers: int
    ) -> tuple[list[int], Mapping[str, Any], LoaderPhase]:
        """Resume worker ``worker`` from a worker snapshot saved on another data-parallel
        layout: (its lanes, the checkpoint of every lane at the loader's cut, its phase).

        The cut: the rank's workers exchange the snapshots they were given (which item each
        was at), which fixes how many items the saving rank had delivered; every rank had
        delivered as many. Every rank's worker snapshots at that cut are then read from the
        aggregate directory and merged; this worker takes its share of this rank's lanes,
        starting from the worker the loader asks first."""
        o = self.session.spec.settled().options
        saved = restored.phase
        if not o.aggregate_dir or saved is None:
            _refuse_other_layout(self.session, restored)
        if restored.worker != worker:
            raise CheckpointError(
                f"load_state_dict(): DataLoader worker {worker} was given the state of worker "
                f"{restored.worker}; restore through the StatefulDataLoader that saved it."
            )
        if self._cut_slots is None:
            raise CheckpointError("load_state_dict(): this DataLoader worker started without its rank's shared memory.")
        phases = CutExchange(self._cut_slots).exchange(saved, worker, workers, o.aggregate_timeout_s)
        try:
            rank_items, cut, last = loader_cut(phases, workers)
        except CheckpointError as err:
            raise CheckpointError(f"load_state_dict(): {err}") from None
        merged = read_loader_parts(
            cut,
            directory=o.aggregate_dir,
            run_id=restored.run_id or o.run_id,  # the saving job's: a resumed job may have its own
            phase=saved.name,
            groups=restored.dp_degree,
        )
        # The loader asks first the worker after the last one that yielded (idle ones drop out).
        first = last + 1 if last + 1 < active_workers(len(self.session.rank_lanes()), workers) else 0
        pending = {lane: state.items for lane, state in parse_checkpoint(merged).lanes.items()}
        lanes = self._lanes_of(worker, workers, first_worker=first, emitted=pending)
        return (
            lanes,
            merged,
            self._new_phase(f"{saved.name}/{rank_items}", worker, workers, first=first, serving=bool(lanes)),
        )

    def _new_phase(self, start: str, worker: int, workers: int, *, first: int, serving: bool) -> LoaderPhase:
        """This worker's phase from its start: named by where it started (a fresh pass, a
        restored checkpoint, a cut of an earlier phase) and the layout it runs on, so that two
        jobs under one run_id keep their snapshots apart unless they deliver the same items;
        the loader asks worker ``first`` first."""
        o = self.session.spec.settled().options
        layout = (o.resolved_canonical_replicas(), o.resolved_dp_degree(), o.resolved_mapping(), workers)
        name = hashlib.sha256(f"{start}|{layout}".encode()).hexdigest()[:16]
        active = active_workers(len(self.session.rank_lanes()), workers)
        return LoaderPhase(name=name, position=(worker - first) % active if serving else -1, active=active)

    def open_worker_reports(self, context: multiprocessing.context.BaseContext) -> None:
        """Have loader workers started with ``context`` hand what their passes dropped to this
        process, which says it once per pass (`say_worker_losses`)."""
        if self._reports is None:
            self._reports = context.SimpleQueue()

    def next_pass(self) -> None:
        """The loader starts a pass (its workers are about to start): reports of earlier passes
        left unread are not this one's."""
        self._pass_token += 1

    def say_worker_losses(self) -> None:
        """The loader's pass ended: say what the workers' passes dropped, merged into one report
        with the rank's totals (`zephon_columnar.engine.pass_report`), from the training loop's
        ``next()``."""
        if self._reports is None:
            return
        reports = []
        while not self._reports.empty():
            token, blob = self._reports.get()
            if token == self._pass_token:
                reports.append(cloudpickle.loads(blob))
        if reports:
            say(PassReport.merged(reports).said())

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if multiprocessing.context.get_spawning_popen() is None:
            # shared memory travels only to processes being started
            state["_worker_pass"] = state["_cut_slots"] = state["_progress_slots"] = state["_reports"] = None
        else:
            self._start_progress()  # a loader worker is starting: its counts are shown here
        state["_worker_session"] = state["_worker_lanes"] = state["_progress_thread"] = None
        return state

    def _start_progress(self) -> None:
        """The trainer process's one readout of the loader workers' counts (once a dataset)."""
        if self.session.shows_progress and self._progress_thread is None:
            alive = weakref.ref(self)
            self._progress_thread = report_shared(
                self.session.new_progress,
                SharedCounts(self._progress_slots, components=self._components),
                lambda: alive() is not None,
            )


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


def _refuse_other_layout(session: Session, state: WorkerState) -> NoReturn:
    """A worker state from another layout without the aggregate directory that holds the
    other ranks' snapshots: its lanes are not this rank's, and going on would deliver another
    rank's data or stop early."""
    o = session.spec.settled().options
    raise CheckpointError(
        f"load_state_dict(): this DataLoader worker state was saved by a rank owning lanes {list(state.rank_lanes)}, "
        f"but under options(dp_degree={o.resolved_dp_degree()}, dp_group_id={o.resolved_dp_group_id()}, "
        f"mapping_strategy={o.resolved_mapping()!r}) this rank owns lanes {session.rank_lanes()}. A StatefulDataLoader "
        "state taken with num_workers > 0 over to_torch_dataset() holds this rank's lanes only; to resume it on "
        "another layout, build the loader with pipe.to_torch_loader(num_workers=...) (its state carries every lane, "
        "gathered through torch.distributed or aggregate_dir), or set options(aggregate_dir=...) to a directory "
        "every rank sees, both when it is saved and when it is resumed (the workers keep their snapshots there), "
        "or checkpoint with num_workers=0 or Pipeline.checkpoint()."
    )


class PipelineMapDataset(torch.utils.data.Dataset[dict[str, Any]]):
    """``Pipeline.to_indexable_torch_dataset()``: sample ``i`` of a 1:1 pipeline by position.

    ``ds[i]`` is the payload of the sample the stream (one lane) yields ``i``-th, as a dict:
    list-of-number fields (``input_ids``, ``loss_mask``, ...) as 1-D tensors, other fields as
    Python values. ``ds.record(i)`` is the full `SampleRecord` (payload and meta). Stateless:
    the loader's sampler decides the order (``DistributedSampler`` for ranks, its
    ``set_epoch`` for reshuffles), so checkpointing is the sampler's position.

    ``__getitems__`` (which ``DataLoader`` calls with each batch's indices) reads all of a
    batch's rows in one fetch and runs each operator once on them.

    Example:
        >>> pipe = pipe.tokenize(tokenizer_id="tok/", field="text", max_length=16, truncation=True,
        ...                      padding="max_length")  # rows of one length: the loader stacks them
        >>> loader = torch.utils.data.DataLoader(pipe.to_indexable_torch_dataset(), batch_size=8,
        ...                                      shuffle=True, num_workers=2)
        >>> len(loader), next(iter(loader))["input_ids"].shape
        (4, torch.Size([8, 16]))
    """

    def __init__(self, indexed: IndexedPipeline) -> None:
        super().__init__()
        self.indexed = indexed

    def __len__(self) -> int:
        return len(self.indexed)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([_position(index)])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        return samples_of(self.indexed.frame([_position(i) for i in indices]), self.indexed.fields)

    def record(self, index: int) -> SampleRecord:
        """The sample at ``index`` as the stream yields it (payload as Python values, and meta)."""
        return self.indexed.records([_position(index)])[0]

    def close(self) -> None:
        """Release the operators' resources (open files); the next lookup sets them up again."""
        self.indexed.close()


def _position(index: Any) -> int:
    if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
        raise TypeError(
            f"an indexable dataset takes integer positions, got {type(index).__name__} {index!r:.60}; "
            "slices and masks are not supported (pass a list of ints to __getitems__)."
        )
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
        pa.types.is_integer(kind.value_type)
        or pa.types.is_floating(kind.value_type)
        or pa.types.is_boolean(kind.value_type)
    )
    values = arr.flatten() if numeric else None
    if values is None or arr.null_count or values.null_count:
        rows: list[Any] = arr.to_pylist()
        return rows
    flat = torch.from_numpy(np.array(values.to_numpy(zero_copy_only=False)))  # one writable copy
    return list(torch.split(flat, pc.list_value_length(arr).to_numpy().tolist()))
