"""What is accepted for Zephon compatibility and has no effect here, in one place.

Zephon 0.2.0's signatures carry options, arguments and accumulator hooks that configure its own
engine (its IPC and shared memory, where a stage is placed, latency flushes). A Zephon recipe
must run here with only its imports changed, so they are accepted; each is listed here with why
it changes nothing, and ``Pipeline.explain()`` names those a pipeline sets
(`RuntimeOptions.inert_settings`, the builder's ``PipelineSpec.ignored``, the accumulators'
`~zephon_columnar.ops.user.unused_hooks`). Every other option, argument and hook works.

Example:
    >>> print(INERT_OPTIONS["mp_context"])
    process workers always start with spawn (Polars' thread pool does not survive a fork)
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

_SHM = "the side process (mtp_mode) hands items over through its own shared-memory ring (mtp_buffer_bytes)"
_IPC = "process workers exchange Arrow IPC buffers over their own pipes"
_AGGREGATE = "checkpoints merge through options(aggregate_dir=...), as JSON files"
_PREFETCH = "each lane keeps op_queue_capacity frames in flight per stage"

#: ``options(name=...)`` that change nothing here, and why.
INERT_OPTIONS: Mapping[str, str] = MappingProxyType(
    {
        "deterministic": "the engine is always deterministic (the same recipe gives the same batches)",
        "allow_latency_flush_in_deterministic": "there are no latency flushes: flush points are counted in chunks",
        "per_stage_runner": "every stage runs on options(runner=...)",
        "mp_context": "process workers always start with spawn (Polars' thread pool does not survive a fork)",
        "worker_allocation": "workers come from max_workers and each operator's parallelism",
        "default_stage_prefetch": _PREFETCH,
        "per_stage_prefetch": _PREFETCH,
        "ipc_transport": _IPC,
        "ipc_buffer_bytes": _IPC,
        "mixture_config": "the mixture is the work source's",
        "shutdown_mode": "closing an iterator always stops its workers promptly",
        "mtp_prefetch": "the side process fills its ring of mtp_buffer items",
        "mtp_auto_checkpoint": "a checkpoint asks the side process for its state when it is taken",
        "shm_enabled": _SHM,
        "shm_coalesce": _SHM,
        "shm_min_item_bytes": _SHM,
        "shm_min_new_allocation_bytes": _SHM,
        "shm_min_forward_bytes": _SHM,
        "shm_compact_above_ratio": _SHM,
        "shm_compact_min_savings_bytes": _SHM,
        "shm_max_coalesced_bytes": _SHM,
        "max_worker_retries": "a failed operator call raises, naming the operator and the sample; it is not retried",
        "aggregate_store": _AGGREGATE,
        "aggregate_serializer": _AGGREGATE,
        "aggregate_compressor": _AGGREGATE,
    }
)

#: The values a builder's ``placement=`` takes, and why none changes anything.
PLACEMENTS = ("auto", "local", "remote", "driver", "worker")
PLACEMENT = "every stage runs on the pipeline's runner, options(runner=...)"

#: Members of Zephon's `~zephon_columnar.ops.accumulators.Accumulator` that its engine reads and
#: this one never does, and why (``max_latency_ms``: `CountingAccumulator`'s argument).
INERT_ACCUMULATOR_HOOKS: Mapping[str, str] = MappingProxyType(
    {
        "try_epoch_reset": "every flush point resets the accumulator (flush(reset=True)); none is tried early",
        "reads_payload": "records always reach the accumulator with their payloads",
        "max_latency_ms": "calls are cut by count only: a cut by time would make the data depend on timing",
    }
)


__all__ = ["INERT_ACCUMULATOR_HOOKS", "INERT_OPTIONS", "PLACEMENT", "PLACEMENTS"]
