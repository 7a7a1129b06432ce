"""What every runtime check shares: fresh probe copies of an operator (set up as a worker's
copy would be, torn down afterwards, or a `NoProbe` issue saying why none could be made) and
`guarded`, which turns a crashing check into an issue; the probe records (the op's
``validation_samples()`` or the synthetic ones) and the keys that identify a record; the
fingerprints and payload keys outputs and state are compared by; and `Outcome`, what one
``process_many`` call on a probe did (`call`)."""

from __future__ import annotations

import copy
import functools
import hashlib
import pickle
import sys
import types
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from zephon_columnar.validation.report import Issue

if TYPE_CHECKING:
    from zephon_columnar.ops.base import BaseOp
    from zephon_columnar.records import SampleRecord


class NoProbe(Exception):
    """A set-up copy of the op could not be made; ``issue`` says why."""

    def __init__(self, issue: Issue) -> None:
        super().__init__(issue.message)
        self.issue = issue


def guarded(name: str, what: str, check: Callable[[], list[Issue]]) -> list[Issue]:
    """``check()``, or the issue saying why it could not run: validation reports, never raises."""
    try:
        return check()
    except NoProbe as err:
        return [err.issue]
    except Exception as err:  # noqa: BLE001 - validation reports, never raises: whatever a check raised is reported
        return [
            Issue(
                "error",
                "OP_VALIDATOR_CRASHED",
                name,
                (
                    f"the {what} check crashed with {type(err).__name__}: {err}; the op could not be fully validated. "
                    "Fix what the message points at, or set options(auto_validation='off') to skip validation."
                ),
            )
        ]


def fresh_probe(op: BaseOp, name: str, stack: ExitStack, set_up: bool = True) -> BaseOp:
    """A copy of ``op`` set up as the engine sets up a worker's copy (torn down with ``stack``),
    or, with ``set_up=False``, just a copy (see `_validate_op`)."""
    from zephon_columnar.ops.base import OpContext

    try:
        probe = op.clone()
    except Exception as err:
        raise NoProbe(
            Issue(
                "error",
                "OP_VALIDATOR_CRASHED",
                name,
                (
                    f"copying the operator failed (clone() raised {type(err).__name__}: {err}); the engine copies it "
                    "for every worker, so it would fail too. Build unpicklable resources (locks, clients, models) in "
                    "setup(), not __init__."
                ),
            )
        ) from err
    if not set_up:
        return probe
    try:
        probe.setup(OpContext())
    except Exception as err:
        raise NoProbe(
            Issue(
                "warning",
                "OP_REJECTS_GENERIC_PAYLOAD",
                name,
                (
                    f"!! NOT VALIDATED !! setup(OpContext()) raised {type(err).__name__}: {err}, so no runtime check "
                    "ran. Make setup() work without engine services, or validate the op in a test of your own."
                ),
            )
        ) from err
    stack.callback(_teardown, probe)
    return probe


def _teardown(probe: BaseOp) -> None:
    try:
        probe.teardown()
    except Exception:  # noqa: BLE001, S110 - a probe's teardown failing says nothing about the op's data
        pass


def _synthetic_records(n_lanes: int = 3, per_lane: int = 4) -> list[SampleRecord]:
    """``{'text', 'value'}`` records on lanes 0..n_lanes-1, sample ids ``(0, lane, offset)`` (the
    inputs Zephon probes with). The last record of each lane is a fan-out child (lineage
    ``(0,)``, made with `spawn_child`), so an op that rebuilds meta and loses lineage shows."""
    from zephon_columnar.records import SampleMeta, SampleRecord, spawn_child

    records = []
    for lane in range(n_lanes):
        for i in range(per_lane):
            meta = SampleMeta(sample_id=(0, lane, i), lane_id=lane, chunk_id=i // 2, chunk_offset=i)
            if i == per_lane - 1:
                meta = spawn_child(meta, 0, is_last_child=True)
            records.append(SampleRecord(meta, {"text": f"sample_{lane}_{i}", "value": i}))
    return records


def probe_records(op: BaseOp, name: str) -> tuple[list[SampleRecord], bool, list[Issue]]:
    """(records to probe with, whether they are the op's own, issues): ``validation_samples()``
    when it gives a usable list, else the synthetic records."""
    from zephon_columnar.records import SampleMeta, SampleRecord

    def failed(why: str) -> tuple[list[SampleRecord], bool, list[Issue]]:
        return (
            _synthetic_records(),
            False,
            [
                Issue(
                    "warning",
                    "OP_VALIDATION_SAMPLES_FACTORY_FAILED",
                    name,
                    (
                        f"validation_samples() {why}; the synthetic {{'text', 'value'}} records were used instead. "
                        "Return a non-empty list of SampleRecord(SampleMeta(...), payload_dict) shaped like the op's "
                        "input."
                    ),
                )
            ],
        )

    try:
        samples = op.validation_samples()
    except Exception as err:  # noqa: BLE001 - a user's factory may raise anything; reported below
        return failed(f"raised {type(err).__name__}: {err}")
    if samples is None:
        return _synthetic_records(), False, []
    if not isinstance(samples, (list, tuple)) or not samples:
        return failed(f"returned {type(samples).__name__} {samples!r:.60}")
    for r in samples:
        if not isinstance(r, SampleRecord) or not isinstance(r.meta, SampleMeta):
            return failed(f"returned a list holding {type(r).__name__} (not a SampleRecord with a SampleMeta)")
        if not r.meta.tombstone and not isinstance(r.payload, dict):
            return failed(f"returned a record whose payload is a {type(r.payload).__name__} (a payload is a dict)")
    return list(samples), True, []


def shifted(samples: list[SampleRecord]) -> list[SampleRecord]:
    """Copies of ``samples`` under other sample ids (dataset id + 1): a second, distinct input."""
    out = copy.deepcopy(samples)
    for r in out:
        sid = r.meta.sample_id
        if isinstance(sid, tuple) and sid and isinstance(sid[0], int):
            r.meta = replace(r.meta, sample_id=(sid[0] + 1, *sid[1:]))
    return out


def sample_key(record: SampleRecord) -> tuple[Any, tuple[int, ...]]:
    return (record.meta.sample_id, tuple(record.meta.lineage))


class _HashSink:
    """A file that hashes what is written to it: pickling into it costs no memory."""

    def __init__(self) -> None:
        self.hash = hashlib.blake2b(digest_size=16)

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        return len(data)


CODE_TYPES = (
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    types.ModuleType,
    type,
    functools.partial,
)


def fingerprint(value: Any) -> str | None:
    """A digest of ``value``'s whole state (pickle, else cloudpickle), or None when neither can
    serialise it. Code (functions, modules, classes) is fingerprinted by identity: replacing it is
    a change, what it captures is `_captured_state`'s business."""
    if isinstance(value, CODE_TYPES):
        return f"{type(value).__name__}@{id(value)}"
    picklers: list[Any] = [pickle.Pickler]
    try:
        import cloudpickle

        picklers.append(cloudpickle.CloudPickler)
    except ImportError:  # pragma: no cover - cloudpickle is a dependency
        pass
    for pickler in picklers:
        sink = _HashSink()
        try:
            pickler(sink, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
        except Exception:  # noqa: BLE001, S112 - pickling may fail in any way: try the next pickler
            continue
        return sink.hash.hexdigest()
    return None


def output_keys(output: Any) -> list[Any]:
    """What two outputs are compared by: each item's sample id, lineage and full content."""
    from zephon_columnar.records import SampleRecord

    if not isinstance(output, (list, tuple)):
        return [("value", fingerprint(output))]
    keys: list[tuple[Any, ...]] = []
    for item in output:
        if isinstance(item, SampleRecord):
            keys.append(
                (
                    repr(item.meta.sample_id),
                    repr(item.meta.lineage),
                    fingerprint(item.meta),
                    _content_key(item.payload),
                )
            )
        else:
            keys.append((type(item).__name__, fingerprint(item)))
    return keys


def _content_key(value: Any) -> Any:
    """A comparable key of a payload: by value where `payload_key` knows the types (two equal
    tensors pickle to different bytes), else its fingerprint."""
    try:
        return payload_key(value)
    except TypeError:
        return fingerprint(value)


def payload_key(value: Any) -> Any:
    """A hashable key of a payload value, independent of dict order and of array storage."""
    if value is None or type(value) in (str, bytes, int, float, complex, bool):
        return pickle.dumps(value)
    if type(value) in (list, tuple):
        return type(value).__name__, tuple(payload_key(v) for v in value)
    if isinstance(value, dict):
        return "dict", frozenset((payload_key(k), payload_key(v)) for k, v in value.items())
    import numpy as np

    if isinstance(value, (np.ndarray, np.generic)):
        data = payload_key(value.tolist()) if value.dtype.hasobject else value.tobytes()
        return "ndarray", str(value.dtype), value.shape, data
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        return "tensor", str(value.dtype), tuple(value.shape), flat.view(torch.uint8).numpy().tobytes()
    raise TypeError(f"payload values of type {type(value).__name__} cannot be compared")


@dataclass
class Outcome:
    """What one ``process_many`` call did: its output, or the exception it raised."""

    output: Any = None
    error: Exception | None = None

    def same_as(self, other: Outcome) -> bool:
        if (self.error is None) != (other.error is None):
            return False
        if self.error is not None and other.error is not None:
            return type(self.error) is type(other.error) and str(self.error) == str(other.error)
        return output_keys(self.output) == output_keys(other.output)

    def describe(self) -> str:
        if self.error is not None:
            return f"raised {type(self.error).__name__}: {self.error}"
        return f"returned {len(self.output) if isinstance(self.output, (list, tuple)) else 1} items"

    def difference(self, other: Outcome) -> str:
        """Where ``other`` first departs from this outcome, in words."""
        if (
            self.error is not None
            or other.error is not None
            or not (isinstance(self.output, (list, tuple)) and isinstance(other.output, (list, tuple)))
        ):
            return f"first {self.describe()}, then {other.describe()}"
        if len(self.output) != len(other.output):
            return f"first {len(self.output)} items, then {len(other.output)}"
        mine, theirs = output_keys(self.output), output_keys(other.output)
        i = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), 0)
        pair = [getattr(x, "payload", x) for x in (self.output[i], other.output[i])]
        if _content_key(pair[0]) == _content_key(pair[1]):  # the payloads agree: the meta differs
            pair = [getattr(x, "meta", x) for x in (self.output[i], other.output[i])]
        return f"item {i}: first {pair[0]!r:.120}, then {pair[1]!r:.120}"


def call(probe: BaseOp, samples: list[SampleRecord]) -> Outcome:
    try:
        return Outcome(output=probe.process_many(copy.deepcopy(samples)))
    except Exception as err:  # noqa: BLE001 - the op's own failure: classified by the caller
        return Outcome(error=err)
