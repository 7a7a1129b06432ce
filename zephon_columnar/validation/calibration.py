"""The calibration replay checks of a ``calibration_replayable`` op: the records it gives
(sample id and payload, drops included) must be the same whether it is called on the whole
batch, one record at a time (``process_one``), on records with placeholder scheduling metadata,
or on its accumulator's groups; a mismatch is an error, a replay that cannot be compared a
warning."""

from __future__ import annotations

import copy
from collections import Counter
from contextlib import ExitStack
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from zephon_columnar.validation.accumulators import new_accumulator, ready_batches
from zephon_columnar.validation.probes import fresh_probe, payload_key
from zephon_columnar.validation.report import Issue

if TYPE_CHECKING:
    from zephon_columnar.ops.base import BaseOp
    from zephon_columnar.records import SampleRecord


def calibration_issues(op: BaseOp, name: str, samples: list[SampleRecord], set_up: bool = True) -> list[Issue]:
    """A ``calibration_replayable`` op gives the same records (sample id and payload, drops
    included) whether called on the whole batch, one record at a time (``process_one``), on
    records with placeholder scheduling metadata, or in its accumulator's groups."""
    with ExitStack() as stack:
        if not fresh_probe(op, name, stack, set_up).traits().calibration_replayable:
            return []
    baseline: Counter[Any] | None = None
    for mode in ("batch", "per-record process_one", "placeholder metadata", "accumulator groups"):
        with ExitStack() as stack:
            probe = fresh_probe(op, name, stack, set_up)
            try:
                records = _replay(probe, mode, samples)
            except _AccumulatorUnusable:
                continue  # the accumulator checks report it
            except Exception as err:  # noqa: BLE001 - a user's operator may raise anything; reported below
                why = f"{mode} processing raised {type(err).__name__}: {err}"
                return _replay_unchecked(name, why) if baseline is None else _replay_mismatch(name, why)
        if records is None:
            return _replay_mismatch(name, f"{mode} processing returned something other than a list of SampleRecord")
        try:
            signature = Counter(
                (repr(r.meta.sample_id), payload_key(r.payload)) for r in records if not r.meta.tombstone
            )
        except TypeError as err:
            return _replay_unchecked(name, str(err))
        if baseline is None:
            baseline = signature
        elif signature != baseline:
            return _replay_mismatch(name, f"{mode} processing changed payloads or record counts")
    return []


class _AccumulatorUnusable(Exception):
    pass


def _replay(probe: BaseOp, mode: str, samples: list[SampleRecord]) -> list[SampleRecord] | None:
    """The records ``probe`` emits for ``samples`` processed in ``mode`` (None: not records)."""
    from zephon_columnar.records import SampleRecord

    records = copy.deepcopy(samples)
    if mode == "batch":
        groups = [probe.process_many(records)]
    elif mode == "per-record process_one":
        groups = [probe.process_one(r) for r in records]
    elif mode == "placeholder metadata":
        groups = [probe.process_many([_placeholder(r) for r in records])]
    else:
        try:
            acc = new_accumulator(probe)
            batches = ready_batches(acc.push_many(records), "push_many") + ready_batches(acc.flush(), "flush")
        except Exception as err:
            raise _AccumulatorUnusable() from err
        groups = [probe.process_many(batch) for batch, _ in batches]
    if any(not isinstance(g, (list, tuple)) for g in groups):
        return None
    out = [r for g in groups for r in g]
    return out if all(isinstance(r, SampleRecord) for r in out) else None


def _placeholder(record: SampleRecord) -> SampleRecord:
    """``record`` with the placeholder scheduling metadata calibration replays with (lane 0,
    chunk 0): only its identity (sample id, lineage, tags) is kept."""
    meta = replace(
        record.meta, lane_id=0, chunk_id=0, chunk_offset=0, component_sample_counts={0: 1}, component_token_counts=None
    )
    if meta.contributors:
        meta = meta.with_contributors(
            replace(ref, cursor=replace(ref.cursor, chunk_id=0, chunk_offset=0)) for ref in meta.contributors
        )
    return replace(record, meta=meta)


def _replay_unchecked(name: str, why: str) -> list[Issue]:
    return [
        Issue(
            "warning",
            "OP_CALIBRATION_REPLAY_NOT_VALIDATED",
            name,
            (
                f"calibration_replayable=True could not be checked: {why}. Supply validation_samples() the op accepts "
                "without engine services, with payloads of scalars, lists, dicts, arrays or tensors."
            ),
        )
    ]


def _replay_mismatch(name: str, why: str) -> list[Issue]:
    return [
        Issue(
            "error",
            "OP_CALIBRATION_REPLAY_MISMATCH",
            name,
            (
                f"calibration_replayable=True but {why} compared with one call on the whole batch. Replay must give "
                "the same payloads and record counts per sample however records are grouped and whatever their lane or "
                "chunk; declare calibration_replayable=False if the op depends on them."
            ),
        )
    ]
