"""Runtime options (`RuntimeOptions`): how the engine runs, never what data it produces.

Every field of Zephon 0.2.0's ``RuntimeOptions`` is accepted. Those that tune Zephon's own
machinery (shared-memory IPC settings, worker allocation) are accepted
and documented no-ops here; an unknown option is an error that lists the valid ones.

Fields that change the data: ``canonical_replicas`` (the number of lanes) and, for plans with
stateful operators, ``flush_every_k_chunks``. Both are part of the recipe a checkpoint is
checked against.

Example:
    >>> RuntimeOptions(runner="threads", max_workers=2).resolved_runner()
    'threads'
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypedDict

from zephon_columnar.compatibility import INERT_OPTIONS
from zephon_columnar.errors import ConfigError

RunnerName = Literal["inline", "threads", "process", "remote"]
"""The runners (`zephon_columnar.engine.runners`), as `RuntimeOptions.resolved_runner` names them."""
RunnerChoice = Literal["inline", "threads", "process", "remote", "ray"]
"""What ``options(runner=...)`` takes: a `RunnerName`, or ``"ray"`` for ``"remote"``."""
RUNNER_OF_CHOICE: dict[RunnerChoice, RunnerName] = {
    "inline": "inline",
    "threads": "threads",
    "process": "process",
    "remote": "remote",
    "ray": "remote",
}
DEFAULT_RUNNER: RunnerName = "threads"
RUNNERS_ON_RAY: frozenset[RunnerName] = frozenset({"remote"})
"""The runners that need the ``ray`` extra (checked when the options are)."""
MappingStrategy = Literal["contiguous", "interleaved"]
IpcTransport = Literal["socketpair", "pipe"]

# The options accepted for Zephon compatibility that change nothing here, and why, are listed in
# zephon_columnar.compatibility (INERT_OPTIONS); explain() names those a pipeline sets.


class OptionHints(TypedDict, total=False):
    """The keywords of ``Pipeline.options(**hints)``: `RuntimeOptions`' fields and types, so an
    editor completes and checks them (a test holds the two to the same names and types)."""

    runner: RunnerChoice | None
    run_id: str
    per_stage_runner: dict[int, str]
    mp_context: Any
    worker_allocation: str
    max_workers: int | None
    deterministic: bool
    prefetch_batches: int | None
    default_stage_prefetch: int | None
    per_stage_prefetch: dict[int, int]
    op_queue_capacity: int | None
    ipc_transport: IpcTransport
    ipc_buffer_bytes: int
    mixture_config: Any
    io_options: Any
    allow_latency_flush_in_deterministic: bool
    flush_every_k_chunks: int | None
    shutdown_mode: Literal["graceful", "hard"]
    auto_validation: Literal["strict", "warn", "off"]
    mtp_mode: bool
    mtp_buffer: int | None
    mtp_buffer_bytes: int
    mtp_prefetch: int | None
    mtp_auto_checkpoint: bool
    world_size: int
    global_rank: int
    dp_degree: int | None
    dp_group_id: int | None
    canonical_replicas: int | None
    mapping_strategy: MappingStrategy | None
    shm_enabled: bool
    shm_coalesce: bool
    shm_min_item_bytes: int
    shm_min_new_allocation_bytes: int
    shm_min_forward_bytes: int
    shm_compact_above_ratio: float
    shm_compact_min_savings_bytes: int
    shm_max_coalesced_bytes: int
    max_worker_retries: int
    aggregate_dir: str | None
    aggregate_store: Any
    aggregate_timeout_s: float
    aggregate_serializer: str
    aggregate_compressor: str
    execution_tracking: Any
    metrics_sink_config: Any
    op_timeout_s: float | None


def import_ray() -> Any:
    """The ``ray`` module, or a ConfigError saying how to install it."""
    try:
        import ray
    except ImportError as err:
        raise ConfigError(
            "options(runner='remote') runs the stateless stages on Ray, which is not installed: "
            "pip install 'zephon_columnar[ray]' (or pip install ray), or use runner='threads' "
            "or 'process'."
        ) from err
    return ray


@dataclass(frozen=True, kw_only=True)
class RuntimeOptions:
    """Engine knobs. See the module docstring for which ones change the data."""

    runner: RunnerChoice | None = None
    run_id: str = "default_run_id"
    per_stage_runner: dict[int, str] = field(default_factory=dict)
    mp_context: Any = None
    worker_allocation: str = "fit_to_ops"
    max_workers: int | None = None
    deterministic: bool = True
    prefetch_batches: int | None = None
    default_stage_prefetch: int | None = None
    per_stage_prefetch: dict[int, int] = field(default_factory=dict)
    op_queue_capacity: int | None = None
    ipc_transport: IpcTransport = "socketpair"
    ipc_buffer_bytes: int = 524288
    mixture_config: Any = None
    io_options: Any = None
    allow_latency_flush_in_deterministic: bool = True
    flush_every_k_chunks: int | None = None
    shutdown_mode: Literal["graceful", "hard"] = "graceful"
    auto_validation: Literal["strict", "warn", "off"] = "strict"
    mtp_mode: bool = False
    mtp_buffer: int | None = None
    mtp_buffer_bytes: int = 8388608
    mtp_prefetch: int | None = None
    mtp_auto_checkpoint: bool = True
    world_size: int = 1
    global_rank: int = 0
    dp_degree: int | None = None
    dp_group_id: int | None = None
    canonical_replicas: int | None = None
    mapping_strategy: MappingStrategy | None = None
    shm_enabled: bool = True
    shm_coalesce: bool = True
    shm_min_item_bytes: int = 4096
    shm_min_new_allocation_bytes: int = 1 << 20
    shm_min_forward_bytes: int = 128 << 10
    shm_compact_above_ratio: float = 8.0
    shm_compact_min_savings_bytes: int = 16 << 20
    shm_max_coalesced_bytes: int = 64 << 20
    max_worker_retries: int = 3
    aggregate_dir: str | None = None
    aggregate_store: Any = None
    aggregate_timeout_s: float = 180.0
    aggregate_serializer: str = "msgpack"
    aggregate_compressor: str = "zstd"
    execution_tracking: Any = "off"
    metrics_sink_config: Any = None
    #: Seconds a stage call on the threads or process runner may run before the iterator raises
    #: (naming the operators and the first sample); None: no limit. Not Zephon's.
    op_timeout_s: float | None = None

    def inert_settings(self) -> list[str]:
        """The options set here (not at their defaults) that have no effect, one line each with
        why (`zephon_columnar.compatibility.INERT_OPTIONS`).

        Example:
            >>> [line.split(":")[0] for line in RuntimeOptions(mp_context="fork", max_workers=4).inert_settings()]
            ["options(mp_context='fork')"]
        """
        defaults = RuntimeOptions()
        return [
            f"options({name}={getattr(self, name)!r}): {why}"
            for name, why in INERT_OPTIONS.items()
            if getattr(self, name) != getattr(defaults, name)
        ]

    # ------------------------------------------------------------------ updates
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def updated(self, **hints: Any) -> RuntimeOptions:
        """A copy with ``hints`` applied; unknown names and bad values raise, listing the valid
        ones. Options that depend on each other (``world_size``, ``global_rank``, ``dp_degree``)
        are checked together by `validate` when the pipeline builds its engine, so they may be
        given in separate ``options()`` calls, in any order."""
        valid = self.field_names()
        unknown = sorted(set(hints) - set(valid))
        if unknown:
            guesses = [
                f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name)
                for name in unknown
                for close in [difflib.get_close_matches(name, valid, n=1, cutoff=0.75)]
            ]
            if "num_workers" in unknown:  # torch's word: the loader's workers are to_torch_loader's
                guesses.append("(DataLoader workers: pipe.to_torch_loader(num_workers=...))")
            working = [n for n in valid if n not in INERT_OPTIONS]
            raise ConfigError(
                f"options(): unknown option(s) {', '.join(guesses)}. The options that change how this engine "
                f"runs: {', '.join(working)}; also accepted, for Zephon compatibility, with no effect here: "
                f"{', '.join(n for n in valid if n in INERT_OPTIONS)}. (Zephon 0.2.0 warns and ignores an "
                "unknown option; zephon_columnar refuses it, so that a misspelt option never silently leaves "
                "the default in place.)"
            )
        new = dataclasses.replace(self, **hints)
        new.validate_fields()
        return new

    def validate(self) -> None:
        """Every check: each field's own, then the ones between fields."""
        self.validate_fields()
        if not (0 <= self.global_rank < self.world_size):
            raise ConfigError(
                f"options(world_size={self.world_size}, global_rank={self.global_rank}): "
                "need 0 <= global_rank < world_size."
            )
        dp = self.resolved_dp_degree()
        if self.world_size > 1 and self.world_size % dp:
            raise ConfigError(
                f"options(world_size={self.world_size}, dp_degree={dp}): world_size must be a "
                "multiple of dp_degree (ranks per data-parallel group = world_size / dp_degree)."
            )

    def validate_fields(self) -> None:
        """The checks of each field on its own."""
        self.store_options()  # raises on unknown keys and bad values
        self.metrics_sink()
        if self.tracking_value() not in (None, "off", "stages", "nodes"):
            raise ConfigError(
                f"options(execution_tracking={self.execution_tracking!r}): use 'off', 'stages' or "
                "'nodes' (or zephon_columnar.observability.ExecutionTrackingMode)."
            )
        if self.runner is not None and self.runner not in RUNNER_OF_CHOICE:
            raise ConfigError(
                f"options(runner={self.runner!r}): use 'inline', 'threads', 'process' or 'remote' "
                "(Ray; also spelled 'ray')."
            )
        if self.resolved_runner() in RUNNERS_ON_RAY and importlib.util.find_spec("ray") is None:
            import_ray()  # raises, saying what to install
        for name in ("max_workers", "op_queue_capacity", "canonical_replicas", "dp_degree", "mtp_buffer"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"options({name}={v!r}): pass a positive int (or None for the default).")
        v = self.prefetch_batches
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ConfigError(f"options(prefetch_batches={v!r}): pass an int >= 0 (0: no prefetch thread) or None.")
        if self.flush_every_k_chunks is not None and (
            not isinstance(self.flush_every_k_chunks, int) or self.flush_every_k_chunks < 0
        ):
            raise ConfigError(f"options(flush_every_k_chunks={self.flush_every_k_chunks!r}): pass an int >= 0.")
        for name in ("world_size", "global_rank"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "world_size" else 0):
                raise ConfigError(f"options({name}={v!r}): pass an int >= {1 if name == 'world_size' else 0}.")
        if self.op_timeout_s is not None and (
            isinstance(self.op_timeout_s, bool)
            or not isinstance(self.op_timeout_s, (int, float))
            or not 0 < self.op_timeout_s < float("inf")
        ):
            raise ConfigError(f"options(op_timeout_s={self.op_timeout_s!r}): pass seconds > 0, or None for no limit.")
        if self.mapping_strategy not in (None, "contiguous", "interleaved"):
            raise ConfigError(
                f"options(mapping_strategy={self.mapping_strategy!r}): use 'contiguous' or 'interleaved'."
            )

    # ------------------------------------------------------------------ resolved values
    def tracking_on(self) -> bool:
        """Whether ``execution_tracking`` asks for per-operator counters (anything but off)."""
        return self.tracking_value() not in (None, "off")

    def tracking_value(self) -> Any:
        """``execution_tracking`` as a plain value (an `ExecutionTrackingMode` gives its string)."""
        return getattr(self.execution_tracking, "value", self.execution_tracking)

    def tracking_mode(self) -> Any:
        """``execution_tracking`` as an `~zephon_columnar.observability.ExecutionTrackingMode`."""
        from zephon_columnar.observability import ExecutionTrackingMode

        return ExecutionTrackingMode(self.tracking_value() or "off")

    def metrics_sink(self) -> Any:
        """``metrics_sink_config`` as a `zephon_columnar.observability.MetricsSinkConfig` (a dict
        of its fields is converted), or None."""
        from zephon_columnar.observability import MetricsSinkConfig, MetricsSinkMode

        sink = self.metrics_sink_config
        if sink is None or isinstance(sink, MetricsSinkConfig):
            config = sink
        elif isinstance(sink, dict):
            names = {f.name for f in fields(MetricsSinkConfig)}
            unknown = sorted(set(sink) - names)
            if unknown:
                raise ConfigError(f"options(metrics_sink_config=...): unknown keys {unknown}; valid: {sorted(names)}.")
            config = MetricsSinkConfig(**sink)
        else:
            raise ConfigError(
                f"options(metrics_sink_config={sink!r}): pass a "
                "zephon_columnar.observability.MetricsSinkConfig, a dict of its fields, or None."
            )
        if config is not None:
            try:
                MetricsSinkMode(config.mode)
            except ValueError:
                raise ConfigError(f"MetricsSinkConfig(mode={config.mode!r}): use 'log', 'statsd' or 'both'.") from None
            if not isinstance(config.flush_interval_s, (int, float)) or config.flush_interval_s < 0:
                raise ConfigError(
                    f"MetricsSinkConfig(flush_interval_s={config.flush_interval_s!r}): pass seconds >= 0."
                )
            if not isinstance(config.max_batch_size, int) or config.max_batch_size < 1:
                raise ConfigError(f"MetricsSinkConfig(max_batch_size={config.max_batch_size!r}): pass an int >= 1.")
        return config

    def store_options(self) -> Any:
        """``io_options`` as a `zephon_columnar.io.options.StoreOptions` (a dict is converted)."""
        from zephon_columnar.io.options import StoreOptions

        return StoreOptions.from_any(self.io_options)

    def resolved_runner(self) -> RunnerName:
        """The runner's name, aliases resolved (`DEFAULT_RUNNER` when none was chosen)."""
        return DEFAULT_RUNNER if self.runner is None else RUNNER_OF_CHOICE[self.runner]

    def resolved_max_workers(self) -> int:
        return self.max_workers or max(1, min(os.cpu_count() or 1, 16))

    def resolved_prefetch_batches(self) -> int:
        return self.prefetch_batches or max(8, 2 * self.resolved_max_workers())

    def resolved_queue_capacity(self) -> int:
        # Zephon's default, max(8, prefetch_batches). The reader decodes several row groups per
        # call, so a window under that granularity makes the fetch worker and the ordered stage
        # wait for each other (pre-tokenized first_fit on 2 cores: ~20% slower with 4).
        return self.op_queue_capacity or max(8, self.resolved_prefetch_batches())

    def resolved_dp_degree(self) -> int:
        return self.dp_degree or self.world_size

    def resolved_dp_group_id(self) -> int:
        if self.dp_group_id is not None:
            return self.dp_group_id
        # Ranks that share a data-parallel group (tensor/pipeline peers) see the same data.
        return self.global_rank // max(1, self.world_size // self.resolved_dp_degree())

    def resolved_canonical_replicas(self) -> int:
        return self.canonical_replicas or self.resolved_dp_degree()

    def resolved_mapping(self) -> MappingStrategy:
        return self.mapping_strategy or "contiguous"
