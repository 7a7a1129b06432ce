"""The device hand-off: a batch's training tensors from the host to the accelerator.

Two ways in, one rule: a tensor crosses in the dtype it has on the host (token ids are int32
there: half the bytes of int64 over the bus) and is widened to the asked dtype on the device.

- `move_to_device` is what ``to_training(device=..., non_blocking=...)`` does once the tensors
  are built on the host (as views of the Arrow buffers where they can be: no host copy).
- `DeviceLoader` is what ``to_torch_loader(device=..., prefetch=k)`` returns. A thread takes
  each batch from the loader, copies it into a reused ring of pinned host buffers (`StagingRing`:
  no allocation per batch) and starts its copy to the device on a side CUDA stream; the trainer
  gets it with an event its stream waits on. ``k`` batches are taken and cross while the trainer
  computes on the current one (``k=0``: each is taken when asked for, in the trainer's thread).

Without CUDA the same code runs on the CPU: the ring is plain memory and each copy finishes
before it returns; every tensor handed over is a fresh one (never a view of the ring or of the
loader's memory).

Example:
    >>> tensors = {"input_ids": torch.arange(6, dtype=torch.int32).reshape(2, 3), "ids": [(0, 0, 0)]}
    >>> plan = TransferPlan(device=torch.device("cpu"), dtype=torch.int64)
    >>> moved = move_to_device(tensors, plan)
    >>> moved["input_ids"].dtype, moved["ids"]
    (torch.int64, [(0, 0, 0)])
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

import torch

from zephon_columnar.errors import ConfigError

#: to_training's outputs that keep their own integer dtype whatever ``dtype`` asks (sequence
#: metadata, int32 as flash-attention kernels take it).
OWN_DTYPE_OUTPUTS = ("cu_seqlens", "max_seqlen")

# Each tensor's place in a staging buffer starts at a multiple of this many bytes (any dtype's
# alignment, and a cache line).
_ALIGN = 64


def parse_device(device: Any, *, where: str = "to_training") -> torch.device:
    """``device`` as a ``torch.device``; a ConfigError from ``where`` when it is not one or this
    machine has no such accelerator (rather than a failure at the first batch).

    Example:
        >>> parse_device("cpu")
        device(type='cpu')
        >>> parse_device("gpu")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        zephon_columnar.errors.ConfigError: to_training: device='gpu' is not a torch device; pass e.g. 'cuda', ...
    """
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ConfigError(
            f"{where}: device={device!r} is not a torch device; pass e.g. 'cuda', 'cuda:1' or 'cpu'."
        ) from err
    if parsed.type != "cpu":
        current = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        if current is None or current.type != parsed.type:
            raise ConfigError(
                f"{where}: device={device!r}, but this torch has no {parsed.type} device "
                f"(torch.accelerator.current_accelerator() is {current}); pass device='cpu', or None "
                "for host tensors."
            )
    return parsed


@dataclass(frozen=True, kw_only=True)
class TransferPlan:
    """Where a batch's tensors go and what they become there: integer tensors are widened to
    ``dtype`` on ``device`` (None: they keep their dtype), apart from the outputs named in
    ``keep_dtype``; ``non_blocking`` lets a copy from pinned memory return before it finishes."""

    device: torch.device
    dtype: torch.dtype | None
    keep_dtype: frozenset[str] = frozenset(OWN_DTYPE_OUTPUTS)
    non_blocking: bool = False

    def widens(self, name: str, tensor: torch.Tensor) -> bool:
        """Whether output ``name`` changes dtype on the device (integers do, masks and floats
        and the sequence metadata do not)."""
        kind = tensor.dtype
        integral = not (kind.is_floating_point or kind.is_complex or kind == torch.bool)
        return self.dtype is not None and integral and kind != self.dtype and name not in self.keep_dtype


def move_to_device(tensors: Mapping[str, Any], plan: TransferPlan) -> dict[str, Any]:
    """``tensors`` on ``plan.device``, each copied in its own dtype and widened there as the plan
    says; what is not a tensor (sample ids, texts, counts) is passed as it is. On the CPU each
    tensor is one fresh, contiguous copy (the widening is that copy)."""
    return {
        name: _moved(value, plan, plan.widens(name, value)) if isinstance(value, torch.Tensor) else value
        for name, value in tensors.items()
    }


def _moved(tensor: torch.Tensor, plan: TransferPlan, widen: bool) -> torch.Tensor:
    dtype = plan.dtype if widen and plan.dtype is not None else tensor.dtype
    if plan.device.type == "cpu":
        return tensor.to(dtype=dtype, copy=True, memory_format=torch.contiguous_format)
    moved = tensor.to(plan.device, non_blocking=plan.non_blocking)
    return moved.to(dtype) if widen else moved


class StagingRing:
    """``slots`` host buffers, reused in turn, that batches are copied into before they cross to
    the device: pinned (page-locked, so the copy runs asynchronously by DMA) when ``pinned``,
    plain memory otherwise. A slot is written again only after the copy out of it finished (the
    event `release` was given), and grows only when a batch needs more bytes than it holds.

    Example:
        >>> ring = StagingRing(slots=2, pinned=False)
        >>> first = ring.stage({"x": torch.ones(3)})
        >>> second = ring.stage({"x": torch.ones(3)})
        >>> third = ring.stage({"x": torch.zeros(3)})  # back to the first slot
        >>> third["x"].data_ptr() == first["x"].data_ptr() != second["x"].data_ptr()
        True
    """

    def __init__(self, *, slots: int, pinned: bool) -> None:
        self.pinned = pinned
        self._buffers: list[torch.Tensor | None] = [None] * slots
        self._copies: list[torch.cuda.Event | None] = [None] * slots
        self._next = 0
        self._last = 0

    def stage(self, tensors: Mapping[str, Any]) -> dict[str, Any]:
        """``tensors`` copied into the next slot (contiguous views of its buffer), the rest as
        it is. Give `release` the event of the copy out of it, when that copy is asynchronous."""
        slot = self._last = self._next
        self._next = (slot + 1) % len(self._buffers)
        copy = self._copies[slot]
        if copy is not None:
            copy.synchronize()  # the batch staged here k batches ago has crossed
            self._copies[slot] = None
        places = {}
        size = 0
        for name, value in tensors.items():
            if isinstance(value, torch.Tensor):
                places[name] = size
                size += -(-value.nbytes // _ALIGN) * _ALIGN
        buffer = self._buffers[slot]
        if buffer is None or buffer.numel() < size:
            buffer = torch.empty(size, dtype=torch.uint8, pin_memory=self.pinned)
            self._buffers[slot] = buffer
        staged = dict(tensors)
        for name, start in places.items():
            value = tensors[name]
            view = buffer[start : start + value.nbytes].view(value.dtype).view(value.shape)
            staged[name] = view.copy_(value)
        return staged

    def release(self, copy: torch.cuda.Event | None) -> None:
        """The slot `stage` last filled is written again only once ``copy`` (an event recorded
        after the asynchronous copy out of it) has completed."""
        self._copies[self._last] = copy


class Checkpointable(Protocol):
    """What keeps a loader's position: a torchdata ``StatefulDataLoader`` built by
    ``to_torch_loader``, or the dataset of a plain ``DataLoader``. ``state_dict()`` is
    ``completed(position())``: `position` is this rank's state after the last batch taken, at
    once (a `DeviceLoader` records it with every batch it takes); `completed` merges it with
    every rank's part of the same step (a collective across ranks, so only when asked)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def position(self) -> dict[str, Any]: ...

    def completed(self, position: Mapping[str, Any]) -> dict[str, Any]: ...

    def set_mixture(self, weights: Mapping[str, float], *, at_state: Mapping[str, Any] | None = None) -> Any: ...


@dataclass(frozen=True, kw_only=True)
class _Crossing:
    """A batch on its way to the device: its tensors there, the event its copy recorded (None
    on the CPU) and the loader's state just after it was taken; or the loader's end (``ended``,
    with the state after the last batch), or the error taking a batch raised."""

    tensors: dict[str, Any] = field(default_factory=dict)
    ended: bool = False
    copied: torch.cuda.Event | None = None
    state: dict[str, Any] | None = None
    error: BaseException | None = None


class _Crossings:
    """Takes the loader's batches one by one, each with the loader's state just after it, and
    starts each one's way to the device (staged in the ring, copied on ``stream``)."""

    def __init__(
        self,
        batches: Iterator[Any],
        *,
        ring: StagingRing,
        stream: torch.cuda.Stream | None,
        plan: TransferPlan,
        state_now: Callable[[], dict[str, Any] | None],
    ) -> None:
        self.batches, self.ring, self.stream, self.plan, self.state_now = batches, ring, stream, plan, state_now

    def take(self) -> _Crossing:
        """The next batch on its way, the loader's end, or the error taking it raised."""
        try:
            batch = next(self.batches)
        except StopIteration:
            return _Crossing(ended=True, state=self.state_now())
        except Exception as error:  # noqa: BLE001 - re-raised when the trainer reaches this batch, not k early
            return _Crossing(error=error)
        state = self.state_now()
        staged = self.ring.stage(batch)
        copied = None
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            moved = move_to_device(staged, self.plan)
            if self.stream is not None:
                copied = torch.cuda.Event()
                copied.record(self.stream)
        self.ring.release(copied)
        return _Crossing(tensors=moved, copied=copied, state=state)

    def feed(self, ahead: queue.Queue[_Crossing], stop: threading.Event) -> None:
        """Fill ``ahead`` (a bounded queue) until the loader ends or ``stop`` is set."""
        if self.stream is not None and self.plan.device.index is not None:
            torch.cuda.set_device(self.plan.device)  # this thread's current device, for its allocations
        while not stop.is_set():
            try:
                crossing = self.take()
            except BaseException as error:  # noqa: BLE001 - staging failed: the trainer hears of it, never waits
                crossing = _Crossing(error=error)
            while not stop.is_set():
                with contextlib.suppress(queue.Full):
                    ahead.put(crossing, timeout=0.1)
                    break
            if crossing.ended or crossing.error is not None:
                return


class DeviceLoader:
    """Batches of ``loader`` on ``plan.device``, ``prefetch`` of them crossing ahead of the one
    the trainer holds (see the module docstring for how). What `Pipeline.to_torch_loader` returns
    when given a ``device``.

    ``state_dict()`` is the loader's position after the last batch handed to the trainer, not
    after the ones crossing ahead: ``checkpoints`` (the ``StatefulDataLoader``, or the dataset
    of a plain ``DataLoader`` without workers) is asked for its state as each batch is taken.
    With None (a plain ``DataLoader`` with workers) ``state_dict()`` asks the dataset, which
    says why it cannot.
    """

    def __init__(
        self,
        loader: torch.utils.data.DataLoader[Any],
        plan: TransferPlan,
        *,
        prefetch: int,
        checkpoints: Checkpointable | None,
    ) -> None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ConfigError(f"to_torch_loader(prefetch={prefetch!r}): pass an int >= 0 (batches crossing ahead).")
        self.loader = loader
        self.plan = plan
        self.prefetch = prefetch
        self._checkpoints = checkpoints
        self._delivered_state: dict[str, Any] | None = None  # None: nothing taken since the start or a load
        self._feeding: tuple[threading.Event, threading.Thread, queue.Queue[_Crossing]] | None = None
        self._restart = False  # set_mixture asked the open iteration to start again

    @property
    def dataset(self) -> Any:
        return self.loader.dataset

    def __iter__(self) -> Iterator[dict[str, Any]]:
        batches = iter(self.loader)
        while True:  # once more after each set_mixture: the batches crossing ahead are dropped
            self._restart = False
            ended = yield from self._cross(batches)
            if ended:
                return

    def _cross(self, batches: Iterator[Any]) -> Generator[dict[str, Any], None, bool]:
        """The batches of ``batches`` on the device; True once they end, False when
        `set_mixture` asks to start again from the trainer's position."""
        cuda = self.plan.device.type == "cuda"
        crossings = _Crossings(
            batches,
            ring=StagingRing(slots=self.prefetch + 1, pinned=cuda),
            stream=torch.cuda.Stream(self.plan.device) if cuda else None,
            # From pinned memory the copy is asynchronous on the side stream; elsewhere synchronous.
            plan=replace(self.plan, non_blocking=True) if cuda else self.plan,
            state_now=self._state_now,
        )
        ahead: queue.Queue[_Crossing] | None = None
        stop = threading.Event()
        if self.prefetch:  # a thread takes and stages the next batches while the trainer computes
            ahead = queue.Queue(maxsize=self.prefetch)
            feeder = threading.Thread(
                target=crossings.feed, args=(ahead, stop), name="zephon_columnar-device-prefetch", daemon=True
            )
            feeder.start()
            self._feeding = (stop, feeder, ahead)
        try:
            while not self._restart:
                head = crossings.take() if ahead is None else ahead.get()
                if head.error is not None:
                    raise head.error
                self._delivered_state = head.state
                if head.ended:
                    return True
                if head.copied is not None:
                    current = torch.cuda.current_stream(self.plan.device)
                    current.wait_event(head.copied)
                    for value in head.tensors.values():
                        if isinstance(value, torch.Tensor):
                            value.record_stream(current)  # made on the side stream, used on this one
                yield head.tensors
            return False
        finally:
            self._stop_feeding()

    def _stop_feeding(self) -> None:
        """Stop the thread taking batches ahead, if one runs, and drop what it took."""
        feeding, self._feeding = self._feeding, None
        if feeding is None:
            return
        stop, feeder, ahead = feeding
        stop.set()
        while feeder.is_alive():  # unblock a feeder waiting on a full queue, then let it see stop
            with contextlib.suppress(queue.Empty):
                ahead.get_nowait()
            feeder.join(timeout=0.01)

    def set_mixture(self, weights: Mapping[str, float]) -> Any:
        """`Pipeline.set_mixture` at the trainer's step, not at the batches crossing ahead: the
        loader below changes the mixture from the position of the last batch handed to the
        trainer (its `state_dict`, a collective), the crossed batches are dropped, and the
        iteration goes on from there. Returns the `MixtureChange`."""
        state = self.state_dict()
        self._stop_feeding()  # nothing takes batches while the loader below restarts
        change = self._checkpointer().set_mixture(weights, at_state=state)
        self._restart = True
        return change

    def _state_now(self) -> dict[str, Any] | None:
        return None if self._checkpoints is None else self._checkpoints.position()

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch handed to the trainer (before the first: the
        loader's own), completed across ranks now (`Checkpointable`)."""
        if self._delivered_state is not None:
            return self._checkpointer().completed(self._delivered_state)
        return self._checkpointer().state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume after the batch ``state`` was taken at (from `state_dict`)."""
        self._checkpointer().load_state_dict(state)
        self._delivered_state = None

    def _checkpointer(self) -> Checkpointable:
        # Without one (a plain DataLoader with workers) the dataset says why it cannot checkpoint.
        return cast("Checkpointable", self.loader.dataset) if self._checkpoints is None else self._checkpoints
