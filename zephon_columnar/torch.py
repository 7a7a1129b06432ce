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
``loader.state_dict()`` / ``loader.load_state_dict()`` resume exactly mid-epoch.

A worker's state holds its own lanes only. To resume it on another data-parallel layout
(checkpoint on 8 ranks, resume on 4), set ``options(aggregate_dir=...)`` (a directory every
rank sees): each worker snapshot also keeps its lanes' checkpoint there (`write_loader_part`,
nothing waits for other ranks), and a worker resumed on another layout first learns from its
rank's other workers which snapshot each of them was at (the loader's cut), then merges every
rank's snapshots at that cut (`read_loader_parts`). As with any data-parallel checkpoint, every
rank takes it at the same step. Without ``aggregate_dir`` another layout is refused.

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
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, NoReturn, cast, get_args

import cloudpickle
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch.utils.data
from torch.utils.data._utils.collate import default_collate_fn_map

from zephon_columnar import frame as F
from zephon_columnar.device import Checkpointable, DeviceLoader
from zephon_columnar.engine.aggregate import read_loader_parts, write_loader_part
from zephon_columnar.engine.checkpoint import load_checkpoint, parse_checkpoint
from zephon_columnar.engine.pass_report import PassReport
from zephon_columnar.errors import CheckpointError, ConfigError
from zephon_columnar.losses import say
from zephon_columnar.ops.config import LoaderKind
from zephon_columnar.progress import SharedCounts, Tally, report_shared
from zephon_columnar.training import TrainingOptions
from zephon_columnar.types import SampleBatch

if TYPE_CHECKING:
    from zephon_columnar.engine.indexed import IndexedPipeline
    from zephon_columnar.records import SampleRecord
    from zephon_columnar.session import Session


@dataclass(frozen=True, kw_only=True)
class LoaderPhase:
    """Where a DataLoader worker stands in its loader's worker round robin, which is what
    lines up the snapshots of every worker on every rank into one cut.

    The loader asks its workers in turn, each for one item, starting with worker
    ``(last yielded + 1)``; idle workers (no lanes) drop out. So the ``delivered``-th item of
    the worker at ``position`` among the ``active`` ones is item ``(delivered - 1) * active +
    position`` of its rank's stream, the same on every rank at the same step. ``name`` tells
    phases apart: one from the start of a pass (`PipelineIterableDataset._new_phase`), then
    one per resume on another layout (a resume on the same layout continues its phase).

    Example:
        >>> LoaderPhase(name="0", position=1, active=2, delivered=3).rank_item()
        5
        >>> LoaderPhase(name="0", position=1, active=2).delivered_at(6)  # items 1, 3, 5
        3
    """

    name: str
    position: int  # -1: an idle worker
    active: int
    delivered: int = 0

    def rank_item(self) -> int:
        """The rank's item index (from 0, in this phase) of this worker's latest item; -1 before its first."""
        return (self.delivered - 1) * self.active + self.position if self.delivered else -1

    def delivered_at(self, rank_items: int) -> int:
        """How many items this worker had delivered once its rank had delivered ``rank_items``."""
        return (rank_items - 1 - self.position) // self.active + 1 if rank_items > self.position else 0


#: Most DataLoader workers per rank a resume on another layout coordinates (slots in shared memory).
MAX_LOADER_WORKERS = 256


def _cut_word(generation: int, delivered: int, position: int) -> int:
    """(generation < 2**15, delivered < 2**39, -1 <= position < 511) as one int64 (a store of
    one word is seen whole by another process, as three separate stores need not be).

    Example:
        >>> _cut_word_parts(_cut_word(3, 12345, -1))
        (3, 12345, -1)
    """
    return generation << 48 | (position + 1) << 39 | delivered


def _cut_word_parts(word: int) -> tuple[int, int, int]:
    return word >> 48, word & ((1 << 39) - 1), ((word >> 39) & 511) - 1


class LoaderBatch(dict):
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
) -> torch.utils.data.DataLoader | DeviceLoader:
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
    cls: type[torch.utils.data.DataLoader] = torch.utils.data.DataLoader
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
        cls = _reporting_loader(cls)
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
    if cls is not torch.utils.data.DataLoader:
        checkpoints = cast("Checkpointable", built)  # torchdata's StatefulDataLoader
    elif num_workers == 0:
        checkpoints = dataset
    return DeviceLoader(
        built, dataset.to_training.transfer, prefetch=2 if prefetch is None else prefetch, checkpoints=checkpoints
    )


_REPORTING_LOADERS: dict[type, type] = {}


def _reporting_loader(base: type[torch.utils.data.DataLoader]) -> type[torch.utils.data.DataLoader]:
    """``base`` (torch's DataLoader or torchdata's StatefulDataLoader), whose passes end by saying
    once, in this process, what the loader workers' passes dropped
    (`PipelineIterableDataset.say_worker_losses`). Same name, same behaviour otherwise."""

    def __iter__(self: Any) -> Iterator[Any]:
        self.dataset.next_pass()
        return _ReportingIterator(base.__iter__(self), self.dataset)

    if base not in _REPORTING_LOADERS:
        namespace = {"__iter__": __iter__, "__module__": base.__module__, "__doc__": base.__doc__}
        _REPORTING_LOADERS[base] = type(base.__name__, (base,), namespace)
    return _REPORTING_LOADERS[base]


class _ReportingIterator:
    """A loader's iterator that, when its pass ends, has the dataset say the workers' losses."""

    def __init__(self, inner: Iterator[Any], dataset: PipelineIterableDataset) -> None:
        self._inner = inner
        self._dataset = dataset

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


class PipelineIterableDataset(torch.utils.data.IterableDataset):
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
        self._worker_restore: Mapping[str, Any] | None = None
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

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The checkpoint of what was delivered: ``{"pipeline": ...}`` in the main process;
        in a loader worker (torchdata's ``StatefulDataLoader`` asks there), that worker's lanes
        and their checkpoint."""
        if not self.stateful:
            raise ConfigError("state_dict(): this dataset was built with to_torch_dataset(stateful=False).")
        info = torch.utils.data.get_worker_info()
        if info is not None:
            session = self._worker_session_of(info.id, info.num_workers)
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
                    worker=info.id,
                    delivered=phase.delivered,
                )
            return {
                "worker": info.id,
                "lanes": list(self._worker_lanes or []),
                "rank_lanes": self.session.rank_lanes(),
                "pipeline": ckpt,
                "loader_phase": None if phase is None else asdict(phase),
                "dp_degree": o.resolved_dp_degree(),
                "run_id": o.run_id,
            }
        if self._worker_pass is not None and self._worker_pass.value:
            raise ConfigError(
                "state_dict(): the last pass ran in DataLoader worker processes, which read ahead of "
                "what the training loop took, so this process cannot tell where to resume. Use "
                "torchdata's StatefulDataLoader (exact with num_workers > 0) or "
                "DataLoader(num_workers=0): the pipeline runs its own workers."
            )
        return {"pipeline": self.session.checkpoint()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state_dict()``'s output, before iterating."""
        if not isinstance(state, Mapping) or "pipeline" not in state:
            keys = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise ConfigError(f"load_state_dict(): expected a dict from state_dict() with key 'pipeline', got {keys}.")
        if "lanes" in state:  # one loader worker's state (StatefulDataLoader restores it in that worker)
            if torch.utils.data.get_worker_info() is None:
                raise ConfigError(
                    "load_state_dict(): this is one DataLoader worker's state; restore it through "
                    "the StatefulDataLoader that saved it (loader.load_state_dict)."
                )
            self._worker_restore, self._worker_session, self._worker_lanes = state, None, None
            return
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
                lanes = worker_lanes(self.session, worker, workers)
                self._phase = self._new_phase(self._start, worker, workers, first=0, serving=bool(lanes))
            elif _worker_state_fits(self.session, restored):
                lanes, ckpt = list(restored["lanes"]), restored["pipeline"]
                saved = restored.get("loader_phase")
                self._phase = LoaderPhase(**saved) if saved is not None else None
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

    def _resume_elsewhere(
        self, restored: Mapping[str, Any], worker: int, workers: int
    ) -> tuple[list[int], Mapping[str, Any], LoaderPhase]:
        """Resume worker ``worker`` from a state saved on another data-parallel layout: (its
        lanes, the checkpoint of every lane at the loader's cut, its phase).

        The cut: the rank's workers exchange the snapshots they were given (which item each
        was at), which fixes how many items the saving rank had delivered; every rank had
        delivered as many. Every rank's worker snapshots at that cut are then read from the
        aggregate directory and merged; this worker takes its share of this rank's lanes,
        starting from the worker the loader asks first."""
        o = self.session.spec.settled().options
        saved_phase = restored.get("loader_phase")
        if not o.aggregate_dir or saved_phase is None:
            _refuse_other_layout(self.session, restored)
        saved = LoaderPhase(**saved_phase)
        if int(restored["worker"]) != worker:
            raise CheckpointError(
                f"load_state_dict(): DataLoader worker {worker} was given the state of worker "
                f"{restored['worker']}; restore through the StatefulDataLoader that saved it."
            )
        phases = self._exchange_cut(saved, worker, workers, o.aggregate_timeout_s)
        rank_items = max(p.rank_item() for p in phases) + 1
        cut = {w: p.delivered_at(rank_items) for w, p in enumerate(phases) if p.position >= 0}
        if any(cut[w] != phases[w].delivered for w in cut):
            raise CheckpointError(
                "load_state_dict(): the DataLoader workers' snapshots are not one step of the loader's round robin "
                f"(items delivered per worker {[p.delivered for p in phases]}): was it iterated with in_order=False, "
                "or did a worker run out of data? Such a state resumes on the layout it was saved on only."
            )
        saver_run = restored.get("run_id", o.run_id)  # the saving job's: a resumed job may have its own
        merged = read_loader_parts(
            cut, directory=o.aggregate_dir, run_id=saver_run, phase=saved.name, groups=int(restored["dp_degree"])
        )
        # The loader asks first the worker after the last one that yielded (idle ones drop out).
        last = max(range(len(phases)), key=lambda w: phases[w].rank_item()) if rank_items else workers - 1
        first = last + 1 if last + 1 < active_workers(len(self.session.rank_lanes()), workers) else 0
        pending = {lane: state.items for lane, state in parse_checkpoint(merged).lanes.items()}
        lanes = worker_lanes(self.session, worker, workers, first_worker=first, emitted=pending)
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

    def _exchange_cut(self, saved: LoaderPhase, worker: int, workers: int, timeout_s: float) -> list[LoaderPhase]:
        """The phase of the snapshot each of this rank's ``workers`` loader workers was given,
        through shared memory: each publishes its own (one 64-bit word, written at once),
        then waits for the others'. The word counts restores (a generation), so a slot left
        from an earlier resume of this dataset is not taken for this one."""
        slots = self._cut_slots
        if slots is None or workers > MAX_LOADER_WORKERS:
            raise CheckpointError(
                f"load_state_dict(): resuming {workers} DataLoader workers on another data-parallel "
                f"layout works with at most {MAX_LOADER_WORKERS} workers per rank."
            )
        generation = (_cut_word_parts(slots[worker])[0] + 1) % (1 << 15)
        slots[worker] = _cut_word(generation, saved.delivered, saved.position)
        deadline = time.monotonic() + timeout_s
        while True:
            words = [_cut_word_parts(slots[w]) for w in range(workers)]
            if all(g == generation for g, _, _ in words):
                return [replace(saved, delivered=d, position=p) for _, d, p in words]
            if time.monotonic() > deadline:
                waiting = [w for w, (g, _, _) in enumerate(words) if g != generation]
                raise CheckpointError(
                    f"load_state_dict(): DataLoader worker {worker} waited {timeout_s:.0f}s for "
                    f"workers {waiting} of this rank to load their states (aggregate_timeout_s)."
                )
            time.sleep(0.01)

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


def _worker_state_fits(session: Session, state: Mapping[str, Any]) -> bool:
    """Whether a loader worker's state was saved on this rank's data-parallel layout (its
    rank owned the lanes this rank owns): it then resumes from its own lanes' checkpoint."""
    mine = session.rank_lanes()
    if "rank_lanes" in state:
        return [int(lane) for lane in state["rank_lanes"]] == mine
    # saved before states named their rank's lanes: the worker's own lanes must be this rank's
    return {int(lane) for lane in state["lanes"]} <= set(mine)


def _refuse_other_layout(session: Session, state: Mapping[str, Any]) -> NoReturn:
    """A worker state from another layout without the aggregate directory that holds the
    other ranks' snapshots: its lanes are not this rank's, and going on would deliver another
    rank's data or stop early."""
    o = session.spec.settled().options
    saved = [int(lane) for lane in state.get("rank_lanes", state["lanes"])]
    raise CheckpointError(
        f"load_state_dict(): this DataLoader worker state was saved by a rank owning lanes {saved}, but under "
        f"options(dp_degree={o.resolved_dp_degree()}, dp_group_id={o.resolved_dp_group_id()}, "
        f"mapping_strategy={o.resolved_mapping()!r}) this rank owns lanes {session.rank_lanes()}. A StatefulDataLoader "
        "state taken with num_workers > 0 holds this rank's lanes only; to resume it on another number of ranks, "
        "set options(aggregate_dir=...) to a directory every rank sees, both when it is saved and when it is "
        "resumed (the workers keep their snapshots there), or checkpoint with num_workers=0 or "
        "Pipeline.checkpoint()."
    )


def active_workers(lanes: int, workers: int) -> int:
    """How many of ``workers`` loader workers serve ``lanes`` lanes: the largest divisor of the
    lane count that is at most ``workers`` (as in Zephon; the others stay idle).

    Example:
        >>> active_workers(6, 4), active_workers(4, 3), active_workers(2, 8)
        (3, 2, 2)
    """
    return max(d for d in range(1, min(workers, lanes) + 1) if lanes % d == 0)


def worker_lanes(
    session: Session, worker: int, workers: int, *, first_worker: int = 0, emitted: Mapping[int, int] | None = None
) -> list[int]:
    """The lanes loader worker ``worker`` of ``workers`` serves (see the module docstring):
    counted from the lane the rank serves next (by ``emitted``, items per lane; default: the
    restored checkpoint's), the worker the loader asks first (``first_worker``) takes it.

    Example:
        >>> import pyarrow as pa
        >>> from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
        >>> ds = Dataset.from_tables("a", [pa.table({"x": list(range(8))})])
        >>> pipe = Pipeline(StaticMixtureWorkSource([ds], {"a": 1.0}, chunk_size=2)).options(canonical_replicas=6)
        >>> [worker_lanes(pipe.session, w, 4) for w in range(4)]  # 3 of the 4 workers serve 2 lanes each
        [[0, 3], [1, 4], [2, 5], []]
    """
    from zephon_columnar.engine.ownership import next_lane

    lanes = session.rank_lanes()
    active = active_workers(len(lanes), workers)
    if worker >= active:
        return []
    if emitted is None:
        pending = session.pending  # a restored checkpoint: which lane the rank serves next
        emitted = {} if pending is None else {lane: state.items for lane, state in pending.items()}
    first = 0
    if emitted:
        first = lanes.index(next_lane(lanes, {lane: emitted[lane] for lane in lanes if lane in emitted}))
    rotated = lanes[first:] + lanes[:first]
    return sorted(rotated[(worker - first_worker) % active :: active])


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
        return arr.to_pylist()
    flat = torch.from_numpy(np.array(values.to_numpy(zero_copy_only=False)))  # one writable copy
    return list(torch.split(flat, pc.list_value_length(arr).to_numpy().tolist()))
