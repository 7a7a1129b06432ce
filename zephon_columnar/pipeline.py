"""`Pipeline`: the fluent builder users see (Zephon's API) over the columnar engine.

Example:
    >>> from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
    >>> ws = StaticMixtureWorkSource([Dataset.from_path("web", "data/web")], {"web": 1.0},
    ...                              chunk_size=1024, seed=0)  # doctest: +SKIP
    >>> pipe = Pipeline(ws).filter(pl.col("text").str.len_chars() > 100).batch(8)  # doctest: +SKIP
    >>> for batch in pipe:  # doctest: +SKIP
    ...     tensors = batch.to_training()
    ...     state = pipe.checkpoint()  # JSON-serializable; restore() it into a fresh pipeline

Builder methods change the pipeline in place and return it. Iterating yields `SampleBatch`es
once `batch()` is in the plan, else `SampleRecord`s; iterating again starts from the
beginning unless `restore()` was called.
"""

import copy
import multiprocessing
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import cloudpickle

from zephon_columnar.engine.aggregate import (
    gather_directory,
    gather_torch,
    torch_distributed_ready,
)
from zephon_columnar.engine.calibrate import prime_token_mixture
from zephon_columnar.engine.checkpoint import (
    LaneCursor,
    LaneSnapshot,
    LaneState,
    PipelineState,
    build_checkpoint,
    check_lane_state,
    check_recipe,
    checkpoint_bytes,
    load_checkpoint,
    merge_checkpoints,
    parse_checkpoint,
    source_state_of,
    verify_digests,
)
from zephon_columnar.engine.engine import Engine
from zephon_columnar.engine.indexed import IndexedPipeline, indexing_obstacle
from zephon_columnar.engine.run import Run
from zephon_columnar.engine.warmup import RestoreWarmup
from zephon_columnar.errors import (
    CheckpointError,
    ConfigError,
    ConfigurationWarning,
    PipelineError,
    WrongTypeError,
    warn,
)
from zephon_columnar.io import fs
from zephon_columnar.io.readers import ReaderPool
from zephon_columnar.observability import (
    FetchStageSummary,
    FetchTimingSummary,
    FetchTimingTotals,
    PrefetchTimingSummary,
)
from zephon_columnar.ops.base import BaseOp
from zephon_columnar.ops.batch import BatchOp
from zephon_columnar.ops.config import (
    FlushStrategy,
    Homogeneity,
    LossScope,
    MissingFieldMode,
    PackingAlgorithm,
    ShuffleAlgorithm,
    ShuffleStrategy,
    SpanSource,
    SpecialTokensMode,
    TokenizerBackend,
)
from zephon_columnar.ops.fetch import FetchOp, shard_cache_settings
from zephon_columnar.ops.map import FilterOp, MapBatchOp, MapOp, MaterializeOp
from zephon_columnar.ops.user import FunctionOp
from zephon_columnar.options import RuntimeOptions
from zephon_columnar.progress import Progress
from zephon_columnar.validation import (
    ValidationError,
    ValidationReport,
    preflight_tokenizers,
    validate_ops,
)
from zephon_columnar.work.base import WorkSource

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11; annotations only


class Pipeline:
    """Fluent builder: work source -> fetch -> your transforms -> batch -> training loop."""

    def __init__(self, work_source: WorkSource) -> None:
        if not isinstance(work_source, WorkSource):
            raise ConfigError(
                f"Pipeline(work_source): got {type(work_source).__name__}; pass a WorkSource "
                "such as StaticMixtureWorkSource(datasets, mixture)."
            )
        self._ws = work_source
        self._ops: list[BaseOp] = [FetchOp()]
        self._options = RuntimeOptions()
        self._prefetch: tuple[int, int] | None = None
        self._pending: dict[int, LaneState] | None = None
        self._pending_recipe: Mapping[str, Any] = {}
        self._run: Run | None = None
        self._lane_subset: list[int] | None = None  # a loader worker's share of this rank's lanes
        self._last_delivered: dict[int, LaneState] | None = None
        self._warmup: RestoreWarmup | None = None
        self._validated: tuple[BaseOp, ...] = ()  # the user operators the last validation passed
        self._checkpoint_round = 0
        self._created_at = time.time()
        self._progress: dict[str, Any] | None = None  # show_progress() settings

    def for_lanes(self, lanes: Sequence[int]) -> "Pipeline":
        """A copy of this pipeline that reads only ``lanes`` of this rank's (a torch loader
        worker's share), not iterated yet. Not in Zephon's API: `torch.py` uses it."""
        return self._copy_with(_lane_subset=list(lanes), _run=None)

    # ------------------------------------------------------------------ builder
    def _refuse_while_iterating(self, what: str) -> None:
        if self._run is not None and not self._run.closed:
            raise RuntimeError(
                f"Pipeline.{what} while the pipeline is being iterated: close the iterator "
                "first (a checkpoint must describe the run that produced it)."
            )

    def _add(self, op: BaseOp) -> "Pipeline":
        self._refuse_while_iterating(f"{op.op_name()}()")
        if any(isinstance(o, BatchOp) for o in self._ops):
            raise ConfigError(
                f"{op.op_name()}() after batch(): only map_batch may follow batch(); add {op.op_name()} before batch()."
            )
        self._ops.append(op)
        return self

    def fetch(self, parallelism: int | None = None, max_batch: int | None = None) -> "Pipeline":
        """Set the implicit fetch's worker count and rows per read (a performance knob only)."""
        for name, v in (("parallelism", parallelism), ("max_batch", max_batch)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ConfigError(f"fetch({name}={v!r}): pass a positive int or None.")
        self._ops[0] = FetchOp(parallelism=parallelism, max_batch=max_batch)
        return self

    fetch_parallelism = fetch  # Zephon's alias of ``fetch(parallelism, max_batch)``

    def prefetch(
        self, buffer_size: int = 1024, parallelism: int | None = None, *, placement: str = "local"
    ) -> "Pipeline":
        """Warm a local cache of remote shards ahead of fetch (background downloads).

        Never changes the data; local files are read in place and need no prefetch.
        """
        if buffer_size < 1 or (parallelism is not None and parallelism < 1):
            raise ConfigError(f"prefetch(buffer_size={buffer_size}, parallelism={parallelism}): pass positive ints.")
        self._prefetch = (buffer_size, parallelism or 4)
        return self

    def materialize(self, placement: str = "auto", parallelism: int | None = None) -> "Pipeline":
        return self._add(MaterializeOp(parallelism))

    def map_transform(
        self, fn: Any, *, drop_none: bool = True, placement: str = "auto", parallelism: int | None = None
    ) -> "Pipeline":
        """Transform rows: ``fn(payload) -> payload | None`` (None drops the row), or Polars
        expression(s) applied with ``with_columns`` to whole frames (the fast path).

        Example:
            >>> pipe.map_transform(pl.col("text").str.strip_chars())  # doctest: +SKIP
            >>> pipe.map_transform(lambda p: p if len(p["text"]) > 10 else None)  # doctest: +SKIP
        """
        return self._add(MapOp(fn, parallelism=parallelism, drop_none=drop_none))

    def filter(self, predicate: Any, *, placement: str = "auto", parallelism: int | None = None) -> "Pipeline":
        """Keep rows where ``predicate`` holds: a boolean Polars expression, a
        ``pyarrow.compute.Expression``, or ``fn(payload) -> bool``."""
        return self._add(FilterOp(predicate, parallelism=parallelism))

    def decode_text(self, parallelism: int | None = None, **kwargs: Any) -> "Pipeline":
        """Decode binary/string fields to text, vectorized: ``fields=("text",), encoding="utf-8",
        errors="strict", normalize_newlines=True, lowercase=False``."""
        from zephon_columnar.ops.decode import DecodeTextOp

        return self._add(DecodeTextOp(parallelism=parallelism, **kwargs))

    def tokenize(
        self,
        tokenizer: Any = None,
        tokenizer_id: str | None = None,
        *,
        field: str,
        missing_field: MissingFieldMode = "error",
        add_attention_mask: bool = True,
        max_length: int | None = None,
        padding: bool | str = False,
        truncation: bool = False,
        return_tensors: str | None = None,
        split_long_samples: bool = False,
        use_fast: bool = True,
        preserve_upstream_payload: bool = False,
        special_tokens: SpecialTokensMode = "bos_eos",
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        placement: str = "auto",
        parallelism: int | None = None,
        backend: TokenizerBackend = "auto",
    ) -> "Pipeline":
        """Tokenize ``field`` into ``input_ids`` (and ``attention_mask``) list<int32> columns.

        ``tokenizer`` may be a ``tokenizers.Tokenizer``, a ``transformers`` fast tokenizer or any
        HF-like callable; ``tokenizer_id`` a ``tokenizer.json`` path or a folder saved by
        ``save_pretrained`` (no ``transformers`` needed). ``backend`` (ours, not Zephon's): who
        encodes, "auto" = the ``fastokens`` encoder where it is proven to give this tokenizer's
        ids (the extra ``fast``), else ``tokenizers`` (`zephon_columnar.ops.tokenizer_backend`).

        Example:
            >>> pipe.tokenize(tokenizer_id="tok/", field="text", special_tokens="eos")  # doctest: +SKIP
        """
        from zephon_columnar.ops.tokenize import TokenizeOp

        return self._add(
            TokenizeOp(
                tokenizer,
                tokenizer_id,
                field=field,
                missing_field=missing_field,
                add_attention_mask=add_attention_mask,
                max_length=max_length,
                padding=padding,
                truncation=truncation,
                return_tensors=return_tensors,
                split_long_samples=split_long_samples,
                use_fast=use_fast,
                preserve_upstream_payload=preserve_upstream_payload,
                special_tokens=special_tokens,
                bos_token_id=bos_token_id,
                eos_token_id=eos_token_id,
                parallelism=parallelism,
                backend=backend,
            )
        )

    def tokenize_chat(
        self,
        tokenizer: Any = None,
        tokenizer_id: str | None = None,
        *,
        eos_token: str | None = None,
        field: str = "messages",
        max_length: int | None = None,
        chat_template: str | None = None,
        apply_chat_template: bool = True,
        span_source: SpanSource = "auto",
        loss_scope: LossScope | None = None,
        loss_on_last_turn_only: bool | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools_field: str = "tools",
        enable_thinking_field: str = "enable_thinking",
        mask_field_out: str = "loss_mask",
        preserve_upstream_payload: bool = False,
        placement: str = "auto",
        parallelism: int | None = None,
        backend: TokenizerBackend = "auto",
    ) -> "Pipeline":
        """Tokenize ``messages`` conversations into ``input_ids`` plus a ``loss_mask`` that is 1 on
        assistant tokens, with a Jinja chat template (text or file) or without one. ``backend``
        as in `tokenize`; with a chat template the tokenizer also gives character offsets (for
        the mask), which only ``tokenizers`` does, so that path encodes with it.

        Example:
            >>> pipe.tokenize_chat(tokenizer_id="tok/", chat_template="chat.jinja")  # doctest: +SKIP
        """
        from zephon_columnar.ops.chat import TokenizeChatOp

        return self._add(
            TokenizeChatOp(
                tokenizer,
                tokenizer_id,
                eos_token=eos_token,
                field=field,
                max_length=max_length,
                chat_template=chat_template,
                apply_chat_template=apply_chat_template,
                span_source=span_source,
                loss_scope=loss_scope,
                loss_on_last_turn_only=loss_on_last_turn_only,
                chat_template_kwargs=chat_template_kwargs,
                tools_field=tools_field,
                enable_thinking_field=enable_thinking_field,
                mask_field_out=mask_field_out,
                preserve_upstream_payload=preserve_upstream_payload,
                parallelism=parallelism,
                backend=backend,
            )
        )

    def expand_chat(
        self, *, field: str = "messages", placement: str = "auto", parallelism: int | None = None
    ) -> "Pipeline":
        """One row per answered user turn of each conversation in ``field``: the conversation up
        to (not including) the next user message (`zephon_columnar.ops.expand_chat`).

        Example:
            >>> pipe.expand_chat(field="messages").tokenize_chat(tokenizer_id="tok/")  # doctest: +SKIP
        """
        from zephon_columnar.ops.expand_chat import ExpandChatOp

        self._check_placement(placement)
        return self._add(ExpandChatOp(field=field, parallelism=parallelism))

    def shuffle(
        self,
        buffer_size: int | None = None,
        *,
        seed: int = 0,
        algorithm: ShuffleAlgorithm = "streaming",
        warmup_growth: float = 1.5,
        placement: str = "auto",
        parallelism: int | None = None,
    ) -> "Pipeline":
        """Shuffle each lane's rows through a deterministic buffer of ``buffer_size`` rows (8192
        when None): ``"streaming"`` (a reservoir), ``"block"`` or ``"block_warmup"`` (tumbling
        blocks). The order is a pure function of (seed, lane, the rows' identities): the same
        after a restart and on every runner; every flush point drains the buffer.

        Example:
            >>> import pyarrow as pa
            >>> from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
            >>> ws = StaticMixtureWorkSource([Dataset.from_tables("toy", [pa.table({"x": list(range(10))})])],
            ...                              {"toy": 1.0}, shuffle_shards=False)
            >>> out = [r.payload["x"] for r in Pipeline(ws).shuffle(4, seed=7)]
            >>> sorted(out) == list(range(10)), out != list(range(10))  # every row once, reordered
            (True, True)
        """
        from zephon_columnar.ops.shuffle import ShuffleOp

        return self._add(
            ShuffleOp(buffer_size, seed=seed, algorithm=algorithm, warmup_growth=warmup_growth, parallelism=parallelism)
        )

    def ensure_mixture(
        self,
        *,
        max_buffer_size: int | None = 1000,
        drain_target_ratio: float = 0.8,
        obsolete_drain_rate: float = 0.1,
        weight_by: Any = "auto",
        warn_tolerance: float | None = None,
        mixture: Mapping[str, float] | None = None,
        placement: str = "auto",
        parallelism: int | None = None,
    ) -> "Pipeline":
        """Hold each lane's output mixture on target (by tokens by default) with smooth weighted
        round robin: rows of a component the target owes go out at once, others wait (up to
        ``max_buffer_size``). See `zephon_columnar.ops.ensure_mixture` for the exact rule.

        Example:
            >>> import pyarrow as pa
            >>> from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
            >>> a = Dataset.from_tables("a", [pa.table({"input_ids": [[1] * 4] * 6})])   # 4-token documents
            >>> b = Dataset.from_tables("b", [pa.table({"input_ids": [[2]] * 12})])      # 1-token documents
            >>> ws = StaticMixtureWorkSource([a, b], {"a": 0.5, "b": 0.5}, shuffle_shards=False)
            >>> [int(r.payload["input_ids"][0]) for r in Pipeline(ws).ensure_mixture(weight_by="input_ids")][:10]
            [1, 2, 2, 2, 2, 1, 2, 2, 2, 2]
        """
        from zephon_columnar.ops.ensure_mixture import EnsureMixtureOp

        return self._add(
            EnsureMixtureOp(
                max_buffer_size=max_buffer_size,
                drain_target_ratio=drain_target_ratio,
                obsolete_drain_rate=obsolete_drain_rate,
                weight_by=weight_by,
                warn_tolerance=warn_tolerance,
                mixture=mixture,
                parallelism=parallelism,
            )
        )

    def stateful_transform(
        self,
        name: str,
        *,
        init_state: Callable[[], Any],
        push: Callable[[Any, list], Any],
        flush: Callable[[Any], list] | None = None,
        should_flush: Callable[[Any], bool] | None = None,
        transform: Callable[[list], list] | None = None,
        placement: str = "auto",
        parallelism: int = 1,
        indexable: bool = False,
        preserves_cursor_order: bool = True,
    ) -> "Pipeline":
        """Per-lane state in your own callbacks: ``push(state, records) -> (state, outputs)`` in
        windows of 64 records, ``flush(state) -> outputs`` at flush points and the end,
        ``should_flush(state)`` for an early flush; ``transform(records) -> records`` runs on the
        workers. See `zephon_columnar.ops.stateful`.

        Example:
            >>> import pyarrow as pa
            >>> from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
            >>> ws = StaticMixtureWorkSource([Dataset.from_tables("toy", [pa.table({"id": [3, 1, 3, 2, 1]})])],
            ...                              {"toy": 1.0}, shuffle_shards=False)
            >>> def dedupe(seen, records):
            ...     fresh = []
            ...     for r in records:
            ...         if r.payload["id"] not in seen:
            ...             seen.add(r.payload["id"])
            ...             fresh.append(r)
            ...     return seen, fresh
            >>> [r.payload["id"] for r in Pipeline(ws).stateful_transform("dedupe", init_state=set, push=dedupe)]
            [3, 1, 2]
        """
        from zephon_columnar.ops.stateful import RecordsTransformOp, StatefulTransformOp

        self._add(
            StatefulTransformOp(
                name,
                init_state=init_state,
                push=push,
                flush=flush,
                should_flush=should_flush,
                indexable=indexable,
                preserves_cursor_order=preserves_cursor_order,
            )
        )
        if transform is not None:
            if not isinstance(parallelism, int) or parallelism < 1:
                raise ConfigError(f"stateful_transform(parallelism={parallelism!r}): pass a positive int.")
            self._add(RecordsTransformOp(name, transform, parallelism))
        return self

    def pack_flat(
        self,
        max_length: int,
        *,
        num_bins: int | None = None,
        max_sequences_per_bin: int | None = None,
        algorithm: PackingAlgorithm = "first_fit",
        tokens_field: str = "auto",
        pad_token_id: int | None = None,
        emit_positions: bool = True,
        drop_oversized: bool | None = None,
        min_sequence_length: int = 1,
        shuffle_strategy: ShuffleStrategy | None = None,
        shuffle_seed: int | None = None,
        flush_strategy: FlushStrategy = "fifo",
        candidate_pool_size: int | None = None,
        max_candidate_age: int | None = None,
        homogeneity: Homogeneity = "none",
        groups: Any = None,
        placement: str = "auto",
        parallelism: int | None = None,
    ) -> "Pipeline":
        """Pack each lane's documents into flat rows of exactly ``max_length`` tokens, ready for
        ``SampleBatch.to_training`` (token column, aligned fields, ``positions`` restarting at
        every document).

        ``algorithm``: ``"wrap"`` (cut the token stream; uncapped wrap never pads and carries
        its partial row across flush points, so it loses only the stream's final partial row),
        ``"first_fit"`` / ``"best_fit"`` (whole documents into ``num_bins`` open bins, padded),
        ``"best_fit_wrap"`` (a candidate pool, at most one split per row). Leftover non-token
        fields (``text``, scalar ids) are dropped by rule, never an error.

        Example:
            >>> import pyarrow as pa
            >>> from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
            >>> ws = StaticMixtureWorkSource(
            ...     [Dataset.from_tables("toy", [pa.table({"input_ids": [[1, 2, 3], [4, 5, 6], [7, 8], [9]]})])],
            ...     {"toy": 1.0},
            ...     shuffle_shards=False,
            ... )
            >>> pipe = Pipeline(ws).pack_flat(5, algorithm="first_fit", num_bins=2, pad_token_id=0).batch(2)
            >>> t = next(iter(pipe)).to_training(return_padding_mask=True)
            >>> t["input_ids"].tolist(), t["positions"].tolist()
            ([[1, 2, 3, 7, 8], [4, 5, 6, 9, 0]], [[0, 1, 2, 0, 1], [0, 1, 2, 0, 0]])
        """
        from zephon_columnar.ops.pack import PackFlatOp

        self._check_groups(groups)
        return self._add(
            PackFlatOp(
                max_length,
                num_bins=num_bins,
                max_sequences_per_bin=max_sequences_per_bin,
                algorithm=algorithm,
                tokens_field=tokens_field,
                pad_token_id=pad_token_id,
                emit_positions=emit_positions,
                drop_oversized=drop_oversized,
                min_sequence_length=min_sequence_length,
                shuffle_strategy=shuffle_strategy,
                shuffle_seed=shuffle_seed,
                flush_strategy=flush_strategy,
                candidate_pool_size=candidate_pool_size,
                max_candidate_age=max_candidate_age,
                homogeneity=homogeneity,
                groups=groups,
                parallelism=parallelism,
            )
        )

    def pack_sequences(
        self,
        max_length: int,
        *,
        num_bins: int | None = None,
        max_sequences_per_bin: int | None = None,
        algorithm: PackingAlgorithm = "first_fit",
        tokens_field: str = "auto",
        length_fn: Any = None,
        drop_oversized: bool | None = None,
        min_sequence_length: int = 1,
        shuffle_strategy: ShuffleStrategy | None = None,
        shuffle_seed: int | None = None,
        flush_strategy: FlushStrategy = "fifo",
        pack_payloads: Any = "keep_list",
        candidate_pool_size: int | None = None,
        max_candidate_age: int | None = None,
        homogeneity: Homogeneity = "none",
        groups: Any = None,
        placement: str = "auto",
        parallelism: int | None = None,
    ) -> "Pipeline":
        """Pack like `pack_flat`, but keep each row's segments apart as ``packed_samples`` (whole
        payloads for first_fit/best_fit, aligned slices for the wrapping algorithms); see
        `zephon_columnar.ops.pack.sequences`.

        Example:
            >>> import pyarrow as pa
            >>> from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
            >>> ws = StaticMixtureWorkSource(
            ...     [Dataset.from_tables("toy", [pa.table({"input_ids": [[1, 2, 3], [4, 5, 6], [7, 8], [9]]})])],
            ...     {"toy": 1.0},
            ...     shuffle_shards=False,
            ... )
            >>> pipe = Pipeline(ws).pack_sequences(5, algorithm="first_fit", num_bins=2)
            >>> [[s["input_ids"].tolist() for s in r.payload["packed_samples"]] for r in pipe]  # arrays: read data
            [[[1, 2, 3], [7, 8]], [[4, 5, 6], [9]]]
        """
        from zephon_columnar.ops.pack import PackSequencesOp
        from zephon_columnar.ops.pack.sequences import merge_with

        self._check_groups(groups)
        if length_fn is not None:
            raise ConfigError(
                "pack_sequences(length_fn=...): packing measures the token field's length here; "
                "pass tokens_field=<the list column to measure> instead (a length field that is "
                "not a list is not supported)."
            )
        self._add(
            PackSequencesOp(
                max_length,
                num_bins=num_bins,
                max_sequences_per_bin=max_sequences_per_bin,
                algorithm=algorithm,
                tokens_field=tokens_field,
                drop_oversized=drop_oversized,
                min_sequence_length=min_sequence_length,
                shuffle_strategy=shuffle_strategy,
                shuffle_seed=shuffle_seed,
                flush_strategy=flush_strategy,
                pack_payloads=pack_payloads,
                candidate_pool_size=candidate_pool_size,
                max_candidate_age=max_candidate_age,
                homogeneity=homogeneity,
                groups=groups,
                parallelism=parallelism,
            )
        )
        if callable(pack_payloads):
            self._add(MapOp(merge_with(pack_payloads), parallelism=parallelism))
        return self

    def _check_groups(self, groups: Any) -> None:
        """``groups`` (for ``homogeneity="group"``) must name mixture components."""
        if groups is None:
            return
        from zephon_columnar.ops.pack import DomainGroups

        g = groups if isinstance(groups, DomainGroups) else DomainGroups(groups)
        names = list(self._ws.component_ids())
        g.validate_against(names)
        loose = sorted(set(names) - set(g.to_member_map()))
        if loose:
            warnings.warn(
                f"pack_flat(groups=...): components {loose} are in no group; each packs on its own.", stacklevel=3
            )

    def add_op(
        self,
        op: BaseOp | str,
        /,
        *,
        name: str | None = None,
        placement: str = "auto",
        process_many: Callable[[list[Any]], list[Any]] | None = None,
        preserves_cursor_order: bool | None = None,
        parallelism: int | None = None,
        **kwargs: Any,
    ) -> "Pipeline":
        """Append a user-defined operator, in either of Zephon's forms.

        - Instance: ``add_op(QualityScoreOp("v2"))``, a `BaseOp` subclass (``traits`` and
          ``process_many``, or a `ColumnarOp` with ``process_columns``). Its traits and
          callables come from the instance; only ``name=`` (renames it) and ``placement=`` may
          be given.
        - Kwargs: ``add_op("score", process_many=fn, preserves_cursor_order=True, ...)`` with
          ``accumulator`` (a factory, ``() -> Accumulator`` or ``(*, deterministic, ctx) ->
          Accumulator``), ``process_one``, ``validation_samples``, ``parallelism``,
          ``indexable``, ``batch_shape_sensitive``, ``requires_serial_state``,
          ``calibration_replayable``; or ``process_columns=fn`` (the columnar hook, with
          ``columns_format="arrow"|"polars"``) instead of ``process_many``.

        The engine deep-copies the op per worker and calls ``setup`` once per copy, on every
        runner; the accumulator groups each lane's records into calls (see
        `zephon_columnar.ops.user`). ``placement`` is accepted for Zephon compatibility and has
        no effect: every stage runs on the pipeline's runner (``options(runner=...)``).
        """
        self._check_placement(placement)
        if isinstance(op, BaseOp):
            if process_many is not None or preserves_cursor_order is not None or parallelism is not None or kwargs:
                given = [
                    k
                    for k, v in (
                        ("process_many", process_many),
                        ("preserves_cursor_order", preserves_cursor_order),
                        ("parallelism", parallelism),
                    )
                    if v is not None
                ]
                raise ConfigError(
                    f"add_op({op.op_name()}, {', '.join(given + sorted(kwargs))}=...): an operator "
                    "instance does not accept the kwargs form's fields: it brings its own traits and "
                    "callables; pass only name= and placement=."
                )
            if name:
                op.name = name
            return self._add(op)
        if not isinstance(op, str):
            raise WrongTypeError(
                f"add_op({type(op).__name__}): pass a BaseOp instance, or a name and process_many= (the kwargs form)."
            )
        if name is not None:
            raise ConfigError(
                f"add_op({op!r}, name={name!r}, ...): the kwargs form takes the operator's name "
                "positionally; drop name= (it renames operator instances only)."
            )
        if preserves_cursor_order is None:
            raise ConfigError(
                f"add_op({op!r}, ...): preserves_cursor_order= is required: True if the operator "
                "emits records in the order it got them, else False."
            )
        unknown = sorted(set(kwargs) - _ADD_OP_KWARGS)
        if unknown:
            raise WrongTypeError(
                f"add_op() got unexpected keyword arguments {unknown}; the kwargs form takes "
                f"{sorted(_ADD_OP_KWARGS | {'process_many', 'preserves_cursor_order', 'parallelism'})}."
            )
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return self._add(
            FunctionOp(
                op,
                process_many=process_many,
                preserves_cursor_order=preserves_cursor_order,
                parallelism=parallelism,
                **kwargs,
            )
        )

    def map_batch(
        self,
        fn: Callable[[Any], Any],
        *,
        drop_none: bool = True,
        placement: str = "auto",
        parallelism: int | None = None,
    ) -> "Pipeline":
        """Transform each delivered batch: ``fn(SampleBatch) -> SampleBatch | None`` (None drops the
        batch; with ``drop_none=False`` it is delivered unchanged). Comes after ``batch()``. It runs
        in the thread that iterates the pipeline, in delivery order: ``parallelism`` and
        ``placement`` are accepted for Zephon compatibility and have no effect.

        Example:
            >>> pipe.batch(8).map_batch(lambda b: b if len(b) == 8 else None)  # doctest: +SKIP
        """
        self._refuse_while_iterating("map_batch()")
        self._check_placement(placement)
        if not any(isinstance(o, BatchOp) for o in self._ops):
            raise ConfigError(
                "map_batch() before batch(): map_batch transforms SampleBatches; call batch() first, "
                "or use map_transform to transform records."
            )
        self._ops.append(MapBatchOp(fn, drop_none=drop_none))
        return self

    @staticmethod
    def _check_placement(placement: str) -> None:
        if placement not in ("auto", "local", "remote", "driver", "worker"):
            raise ConfigError(
                f"placement={placement!r}: use 'auto' (placement has no effect here: every stage "
                "runs on the pipeline's runner)."
            )

    def batch(self, microbatch_size: int, *, drop_last: bool = True, placement: str = "auto") -> "Pipeline":
        """Group each lane's rows into `SampleBatch`es of ``microbatch_size`` (lane-pure).
        ``drop_last=False`` also emits each lane's short final batch."""
        return self._add(BatchOp(microbatch_size, drop_last=drop_last))

    def options(self, **hints: Any) -> "Pipeline":
        """Set `RuntimeOptions` fields; an unknown name raises, listing the valid ones."""
        self._refuse_while_iterating("options()")
        self._options = self._options.updated(**hints)
        return self

    # ------------------------------------------------------------------ inspection
    def _engine(self) -> Engine:
        self._options.validate()
        prefetcher = None
        if self._prefetch is not None:
            from zephon_columnar.engine.prefetch import ShardPrefetcher

            prefetcher = ShardPrefetcher(
                self._ws.datasets_by_id, parallelism=self._prefetch[1], buffer_size=self._prefetch[0]
            )
        return Engine(
            self._ws,
            list(self._ops),
            self._options,
            prefetcher=prefetcher,
            lane_subset=self._lane_subset,
        )

    def _copy_with(self, **private: Any) -> "Pipeline":
        """A shallow copy of this pipeline with some of its private attributes replaced."""
        twin = copy.copy(self)
        vars(twin).update(private)
        return twin

    def _side_process_engine(self) -> Callable[[], Engine]:
        """What builds an mtp-mode side process's engine there: this pipeline up to ``batch``
        (``map_batch`` runs in the trainer), in process, never iterated (picklable)."""
        from zephon_columnar.engine.mtp import ops_up_to_batch

        child = self._copy_with(
            _options=self._options.updated(mtp_mode=False),
            _run=None,
            _warmup=None,
            _pending=None,
            _ops=ops_up_to_batch(self._ops),
        )
        return child._engine  # noqa: SLF001 - a copy of this very pipeline

    def explain(self) -> str:
        """The compiled stages, runner, parallelism, lanes, queue sizes and how checkpoints
        resume; after a run, its counters (``metrics_snapshot``)."""
        text = self._engine().explain()
        counters = self._counters()
        if counters:
            text += "\nCounters of the last run: " + ", ".join(f"{k}={v}" for k, v in sorted(counters.items()))
        return text

    def _counters(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        if self._run is not None:
            for stats in self._run.stats().values():
                for k, v in stats.items():
                    totals[k] = totals.get(k, 0) + v
        return totals

    def metrics_snapshot(self) -> Any:
        """Counters of the current (or last) run: one record per lane and counter (tokens uncapped
        wrap dropped at the end of a lane, ``pack_dropped_final_tokens``; documents and tokens
        first_fit / best_fit dropped as longer than ``max_length``, ``pack_oversized_docs`` /
        ``pack_oversized_tokens``, out of those they were given, ``pack_docs_seen`` /
        ``pack_tokens_seen``; rows exact ``ensure_mixture`` dropped, ``ensure_mixture_dropped``:
        what the pass's `~zephon_columnar.errors.DataDroppedWarning` s were about); with
        `enable_observability`, one per operator (``stage``, ``index``, ``op``, ``calls``,
        ``rows_in``/``rows_out``, ``bytes_in``/``bytes_out``, ``busy_s``; ordered stages have
        ``stage == "ordered"``) and one per parallel stage (``wait_s``: the lanes' time blocked
        on its results; ``in_flight``, ``max_in_flight``: frames). None before any run."""
        from zephon_columnar.observability import PipelineSummary

        if self._run is None:
            return None
        records = [
            {"lane": lane, "name": k, "value": v}
            for lane, stats in sorted(self._run.stats().items())
            for k, v in sorted(stats.items())
        ]
        return PipelineSummary(records=records + self._tracked())

    def _tracked(self) -> list[dict[str, Any]]:
        """The execution-tracking records of the current (or last) run ([] when off)."""
        return self._run.tracked_records() if self._run is not None else []

    def enable_observability(self, tracking: Any = "stages", *, sink: Any = None) -> "Pipeline":
        """Turn on execution tracking (``"stages"``/``"nodes"``, or an
        `~zephon_columnar.observability.ExecutionTrackingMode`; ``"off"`` turns it off): per
        operator and stage counters in `metrics_snapshot`, `fetch_timing_snapshot`,
        `inflight_summary`. Off, the engine runs no tracking code at all. ``sink``: a
        `~zephon_columnar.observability.MetricsSinkConfig` (or a dict of its fields): every pass
        emits `metrics_snapshot` to its log or StatsD sink, every ``flush_interval_s`` seconds and
        at its end (`zephon_columnar.observability`); by default, as Zephon's, INFO records of the
        logger ``"zephon.pipeline"``."""
        from zephon_columnar.observability import MetricsSinkConfig

        off = getattr(tracking, "value", tracking) in (None, "off")
        if sink is None and not off:  # Zephon's default sink: logs (logger "zephon.pipeline", INFO)
            sink = MetricsSinkConfig()
        return self.options(execution_tracking=tracking, metrics_sink_config=sink)

    def fetch_timing_snapshot(self) -> FetchTimingSummary | None:
        """Fetch's timings with execution tracking on, as Zephon's `FetchTimingSummary`: per
        stage, its totals and each shard's (``shard_totals[(dataset_id, shard_id)]``) over its
        *fetch groups* (one read of one shard's rows: ``samples``, ``read_ns``, and the shard
        cache's ``cache_hits`` (a local copy reused), ``cache_misses`` (downloads) and ``retries``
        during it; local files are read in place, neither hit nor miss). ``cache`` adds the cache's
        counters in this process: ``downloads``, ``hits``, ``evictions`` (copies deleted to keep
        ``CacheOptions.limit_bytes``) and ``retries``. None without tracking or a run."""
        if self._run is None or not self._options.tracking_on():
            return None
        cache = fs.default_shard_cache()
        summary = FetchTimingSummary(
            tracking_mode=self._options.tracking_mode(),
            cache={
                "downloads": cache.downloads,
                "hits": cache.hits,
                "evictions": cache.evictions,
                "retries": cache.retries,
            },
        )
        for (stage, dataset_id, shard_id), counts in sorted(self._run.fetch_groups().items()):
            totals = FetchTimingTotals(**{k: int(v) for k, v in counts.items()})
            summary.stages.setdefault(stage, FetchStageSummary(index=stage)).shard_totals[(dataset_id, shard_id)] = (
                totals
            )
            summary.stages[stage].totals.merge(totals)
        return summary

    def prefetch_timing_snapshot(self) -> PrefetchTimingSummary | None:
        """``prefetch()``'s shard downloads as Zephon's `PrefetchTimingSummary` (stage 0: prefetch
        runs in the lane sources, ahead of the first stage): chunks of pointers seen, shards
        submitted, downloaded (with their bytes and seconds), failed; None without ``prefetch()``
        or a run."""
        prefetcher = self._run.engine.prefetcher if self._run is not None else None
        if prefetcher is None:
            return None
        return PrefetchTimingSummary(tracking_mode=self._options.tracking_mode(), stages={0: prefetcher.timing()})

    def inflight_summary(self) -> dict[int, dict[int, int]] | None:
        """``{parallel stage: {lane: frames submitted and not yet taken}}`` now; None without
        tracking or a run."""
        return self._run.in_flight_by_stage() if self._run is not None else None

    @property
    def ws(self) -> WorkSource:
        """The work source the pipeline reads (Zephon's public attribute)."""
        return self._ws

    @property
    def is_indexable(self) -> bool:
        """Whether `to_indexable_torch_dataset` works: every operator is 1:1, stateless and keeps
        order (``indexable`` in its traits), and the work source's stream is finite (a
        ``StaticMixtureWorkSource`` unless it repeats forever; Zephon's never is)."""
        return indexing_obstacle(self._ws, self._ops) is None

    def validate(self, *, strict: bool = False) -> ValidationReport:
        """Run the validation harness on the operators added with ``add_op`` (built-ins are
        skipped): determinism, cross-call state, output types, sample ids and lineage, the
        accumulator contract, and a static scan for writes to ``self`` and unseeded randomness,
        with Zephon 0.2.0's issue codes (`zephon_columnar.validation`). ``strict=True`` raises
        `ValidationError` listing every problem. The first ``iter()`` runs it too
        (``options(auto_validation="strict"|"warn"|"off")``)."""
        report = validate_ops(self._ops)
        if strict and not report.ok:
            raise ValidationError(report)
        return report

    def preflight_tokenizers(self, *, strict: bool = True) -> ValidationReport:
        report = preflight_tokenizers(self)
        if strict and not report.ok:
            raise ValidationError(report)
        return report

    # ------------------------------------------------------------------ iteration
    def _auto_validate(self) -> None:
        """``options(auto_validation=...)``: validate the user operators, once per graph (again
        only after an operator is added, as in Zephon)."""
        mode = self._options.auto_validation
        user_ops = tuple(op for op in self._ops if not op.builtin)
        if mode != "off" and user_ops and self._validated != user_ops:
            report = validate_ops(self._ops)
            if report.issues:  # warnings too, as in Zephon: every report that says something is shown
                warnings.warn(report.format(), stacklevel=3)
            if mode == "strict" and not report.ok:
                raise ValidationError(report)
            self._validated = user_ops

    def _warn_if_every_rank_reads_the_same_data(self) -> None:
        world = self._options.unsharded_world()
        if world is not None:
            warn(
                f"torch.distributed is initialized with {world} ranks, but this pipeline has no data-parallel "
                "options, so every rank receives the same batches. Pass options(dp_degree=..., dp_group_id=...) "
                "(data-parallel groups; tensor-parallel peers share a group) or options(world_size=..., "
                "global_rank=...) when every rank is its own data-parallel group.",
                ConfigurationWarning,
            )

    def __iter__(self) -> Iterator[Any]:
        if self._run is not None and not self._run.closed:
            raise RuntimeError(
                "Pipeline is already being iterated; close the first iterator (or let it finish) "
                "before starting another."
            )
        self._warn_if_every_rank_reads_the_same_data()
        self._auto_validate()
        prime_token_mixture(self._ws, self._ops)
        engine = self._engine()
        cursors = None
        if self._pending is not None:
            check_recipe(self._pending_recipe, engine.recipe())
            cursors = self._owned_cursors(engine, self._pending)
        self._pending = None
        in_daemon = multiprocessing.current_process().daemon
        if self._options.mtp_mode and not in_daemon:
            from zephon_columnar.engine.mtp import MtpRun

            if self._warmup is not None:  # the side process reads through its own readers
                self._warmup.cancel()
                self._warmup = None
            self._run = MtpRun(self._side_process_engine(), engine, cursors)
        else:
            if self._options.mtp_mode:  # a daemon (a DataLoader worker) may not start a process
                warnings.warn(
                    "options(mtp_mode=True) inside a daemon process (a DataLoader worker?): it cannot "
                    "start the engine's side process, so the engine runs in this process.",
                    stacklevel=2,
                )
            self._run = engine.start(cursors, readers=self._take_warmup(engine))
        observers: list[Any] = [] if self._progress is None else [Progress(**self._progress)]
        sink = self._options.metrics_sink()
        if sink is not None:
            from zephon_columnar.observability.sink import MetricsEmitter

            observers.append(MetricsEmitter(sink, self.metrics_snapshot))
        return _RunIterator(self._run, observers)

    def show_progress(self, every_s: float = 10.0, *, file: Any = None, use_tqdm: bool | None = None) -> "Pipeline":
        """Report progress while iterating: items, tokens, tokens/s and each lane's position,
        every ``every_s`` seconds and at the end (`zephon_columnar.progress`; through tqdm when
        installed, else a line on stderr). ``every_s=None`` turns it off."""
        self._progress = None if every_s is None else {"every_s": every_s, "file": file, "use_tqdm": use_tqdm}
        return self

    def mtp_queue_stats(self) -> dict[str, int] | None:
        """With ``options(mtp_mode=True)`` and an open iterator: items ready in the shared-memory
        ring (``depth``) against its ``capacity`` (``mtp_buffer``), and their ``staged_bytes``
        against ``capacity_bytes`` (``mtp_buffer_bytes``). None otherwise."""
        return self._run.queue_stats() if self._run is not None else None

    # ------------------------------------------------------------------ checkpoints
    def _delivered(self) -> dict[int, Any]:
        if self._run is not None:
            return self._run.snapshot()
        if self._pending is not None:
            return dict(self._pending)
        engine = self._engine()
        return {lane: engine.initial_cursor(lane) for lane in engine.lanes}

    def _owned_cursors(self, engine: Engine, lanes: Mapping[int, LaneState]) -> dict[int, LaneState]:
        missing = [lane for lane in engine.lanes if lane not in lanes]
        if missing:
            raise CheckpointError(
                f"checkpoint has lanes {sorted(lanes)} but this rank owns {engine.lanes} (missing {missing}). "
                "Restore a checkpoint merged from all ranks (Pipeline.merge_checkpoints or aggregate_dir)."
            )
        return {lane: lanes[lane] for lane in engine.lanes}

    def checkpoint(self, *, as_bytes: bool = False) -> dict[str, Any] | bytes:
        """A JSON-serializable state of what has been delivered so far (size independent of
        how far the stream went). With several data-parallel ranks it merges every rank's
        lanes through ``torch.distributed`` or ``options(aggregate_dir=...)``; without either
        it returns this rank's lanes (merge them with `Pipeline.merge_checkpoints`).

        Plain Python types only, so ``pickle.dumps``, ``json.dumps`` and ``torch.save`` /
        ``torch.load(weights_only=True)`` all store it. ``as_bytes=True`` (Zephon 0.2.1):
        compact bytes (zstandard-compressed JSON) that ``restore`` takes as they are."""
        if type(self._ws).state_dict is WorkSource.state_dict:
            warn(
                f"{type(self._ws).__name__} does not extend WorkSource.state_dict: the checkpoint holds only its "
                "lane identity, so a restore starts it from its first chunk. Return its position from "
                "state_dict() (and read it in load_state_dict()).",
                ConfigurationWarning,
            )
        ckpt = self._checkpoint()
        return checkpoint_bytes(ckpt) if as_bytes else ckpt

    def _checkpoint(self, *, collective: bool = True) -> dict[str, Any]:
        """`checkpoint`'s dict; ``collective=False``: this engine's lanes only, never merged
        (a DataLoader worker's share)."""
        # The recipe and lanes of the run that delivered the items (options cannot change during a
        # run; after it, the last run still describes what was delivered).
        engine = self._run.engine if self._run is not None else self._engine()
        delivered = self._delivered()
        local = build_checkpoint(
            PipelineState(
                recipe=engine.recipe(),
                world=engine.world(),
                lanes={lane: delivered[lane] for lane in engine.lanes if lane in delivered},
            )
        )
        opts = self._options
        if opts.world_size == 1 or not collective:
            return local
        self._checkpoint_round += 1
        if torch_distributed_ready():
            return gather_torch(local)
        if opts.aggregate_dir:
            return gather_directory(
                local,
                directory=opts.aggregate_dir,
                run_id=opts.run_id,
                round_id=self._checkpoint_round,
                rank=opts.global_rank,
                world_size=opts.world_size,
                timeout_s=opts.aggregate_timeout_s,
                not_before=self._created_at,
            )
        return local

    merge_checkpoints = staticmethod(merge_checkpoints)

    def restore(self, ckpt: Mapping[str, Any] | str | bytes) -> None:
        """Continue from ``ckpt`` (a dict from ``checkpoint()``, its JSON text, or the bytes of
        ``checkpoint(as_bytes=True)``) at the next iteration, exactly where it was taken.

        Raises `CheckpointError` if the checkpoint is malformed, lacks lanes this rank owns,
        or was taken with another recipe (seed, mixture, chunk size, lanes, operators).
        """
        if self._run is not None and not self._run.closed:
            raise RuntimeError("Pipeline.restore() during iteration: close the iterator first.")
        ckpt = load_checkpoint(ckpt)
        saved = parse_checkpoint(ckpt)
        recipe, lanes = saved.recipe, dict(saved.lanes)
        engine = self._engine()
        cache = shard_cache_settings(self._options)
        if cache is not None:  # the restore warm-up below reads through the shard cache
            fs.configure_shard_cache(**cache)
        check_recipe(recipe, engine.recipe())
        for lane, cur in lanes.items():
            check_lane_state(
                lane,
                cur,
                self._ws.datasets_by_id,
                engine.plan.flush_every,
                ordered_stages=len(engine.plan.ordered_stages()),
            )
        for lane in self._owned_cursors(engine, lanes):
            probe = self._ws.clone_for_lane(lane, engine.canonical_replicas)
            cur = lanes[lane]
            # Raises if the source state is not ours.
            state = source_state_of(cur)
            try:
                probe.load_state_dict(state)
            except CheckpointError as err:
                where = "source_state" if isinstance(cur, LaneCursor) else "resume.source_state"
                raise CheckpointError(f"checkpoint lanes.{lane}.{where}: {err}") from err
            if self._ws.requires_token_priming and isinstance(state, Mapping) and state.get("token_ratios"):
                self._ws.prime(ratios=state["token_ratios"])  # the restored run mixes as the saved one
        # Last, after the checks that name a field: a lane edited in a way that still parses.
        verify_digests(ckpt)
        # Every lane is kept: options may still change which lanes this rank owns before iterating.
        self._pending = lanes
        self._pending_recipe = recipe
        self._run = None
        if self._warmup is not None:
            self._warmup.cancel()
        if self._options.resolved_runner() not in ("process", "remote"):  # their workers read with their own readers
            owned = self._owned_cursors(engine, lanes).values()
            first = engine.plan.batch.microbatch_size if engine.plan.batch is not None else 1
            self._warmup = RestoreWarmup.start(
                self._ws.datasets_by_id,
                [  # what each lane's first item needs
                    cur.pending.refs.slice(0, first)
                    for cur in owned
                    if isinstance(cur, LaneSnapshot) and cur.pending is not None
                ],
            )

    def _take_warmup(self, engine: Engine) -> ReaderPool | None:
        """The restore warm-up's readers, for the run ``engine`` is about to start (None: no
        warm-up, or options changed since ``restore()`` so that it read for another run)."""
        warm, self._warmup = self._warmup, None
        if warm is not None and engine.options.resolved_runner() in ("process", "remote"):
            warm.cancel()
            return None
        return warm.pool if warm is not None else None

    # ------------------------------------------------------------------ torch
    def to_torch_dataset(self, stateful: bool = True, **to_training: Any) -> Any:
        """A ``torch.utils.data.IterableDataset`` over this pipeline (use ``batch_size=None``).

        ``state_dict()`` / ``load_state_dict()`` work under a plain ``DataLoader`` with
        ``num_workers=0`` (the pipeline has its own workers) and under torchdata's
        ``StatefulDataLoader`` with any ``num_workers``; loader workers split this rank's lanes
        (`zephon_columnar.torch`). Keyword arguments, if any, are passed to
        ``SampleBatch.to_training`` for each batch. A token-unit mixture is primed here, in the
        calling process (as in Zephon), not in each loader worker.
        """
        from zephon_columnar.torch import PipelineIterableDataset

        self._warn_if_every_rank_reads_the_same_data()  # loader workers have no process group to see
        prime_token_mixture(self._ws, self._ops)  # here, once: loader workers get the primed source
        return PipelineIterableDataset(self, stateful=stateful, to_training=to_training or None)

    def to_indexable_torch_dataset(self) -> Any:
        """A map-style ``torch.utils.data.Dataset``: ``ds[i]`` is the ``i``-th sample of the
        work source's stream from its start (what one lane reads ``i``-th), through this
        pipeline's operators, as a dict of tensors (`zephon_columnar.torch.PipelineMapDataset`).
        The DataLoader's sampler then shuffles and shards (``DistributedSampler``) and its
        ``batch_size`` batches; ``__getitems__`` reads a whole batch in one columnar pass.

        Raises `ConfigError` naming the operator (or the source) that makes the pipeline not
        indexable: one that is not 1:1 (filter, expand_chat, split_long_samples), reorders
        (shuffle, ensure_mixture), keeps state (pack_flat, stateful_transform) or batches; or a
        stream that never ends.
        """
        from zephon_columnar.torch import PipelineMapDataset

        self._auto_validate()
        indexed = IndexedPipeline(self._ws, self._ops, services={"shard_cache": shard_cache_settings(self._options)})
        return PipelineMapDataset(indexed)

    def _idle_state(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_run"] = None
        state["_warmup"] = None
        return state

    def __copy__(self) -> "Pipeline":
        twin = type(self).__new__(type(self))
        twin.__dict__.update(self._idle_state())
        return twin

    def __getstate__(self) -> dict[str, bytes]:
        # by value (cloudpickle): the lambdas of map_transform and friends must reach spawned
        # loader workers, which cannot import them
        return {"cloudpickled": cloudpickle.dumps(self._idle_state())}

    def __setstate__(self, state: dict[str, bytes]) -> None:
        self.__dict__.update(cloudpickle.loads(state["cloudpickled"]))


class _RunIterator:
    """The caller's handle on one pass; closing it (or dropping it) stops the engine.

    ``observers`` (the progress readout, the metrics sink) see every item delivered
    (``update(item)``) and the end of the pass (``close()``, once)."""

    def __init__(self, run: Run, observers: list[Any]) -> None:
        self._run = run
        self._observers = observers
        self._inside = threading.Lock()  # held during next(): a second caller meanwhile is a misuse
        self._shared_by: str | None = None  # the thread that called next() while another was inside

    def __iter__(self) -> "_RunIterator":
        return self

    def __next__(self) -> Any:
        if not self._inside.acquire(blocking=False):
            self._shared_by = threading.current_thread().name
            raise self._shared_error()
        try:
            if self._shared_by is not None:
                raise self._shared_error()
            if not self._observers:
                return next(self._run)
            try:
                value = next(self._run)
            except StopIteration:
                self._end_observers()
                raise
            for observer in self._observers:
                observer.update(value)
            return value
        finally:
            self._inside.release()

    def _shared_error(self) -> PipelineError:
        # Both threads get it (the one inside next() on its following call): neither may go on
        # believing it sees the whole stream.
        return PipelineError(
            f"one pipeline iterator was used by two threads at once (thread {self._shared_by!r} called next() "
            "while another thread was inside it); each item goes to one consumer only. Give each thread its own "
            "pipeline (for disjoint data: options(world_size=N, global_rank=i)), or let one thread iterate and "
            "hand items to the others through a queue.Queue."
        )

    def _end_observers(self) -> None:
        observers, self._observers = self._observers, []
        for observer in observers:
            observer.close()

    def close(self) -> None:
        self._end_observers()
        self._run.close()

    def __enter__(self) -> "Self":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._run.close()
        except Exception:  # noqa: BLE001, S110 - best-effort cleanup at garbage collection: never raise from __del__
            pass


_ADD_OP_KWARGS = frozenset(
    {
        "accumulator",
        "process_one",
        "validation_samples",
        "indexable",
        "batch_shape_sensitive",
        "requires_serial_state",
        "calibration_replayable",
        "process_columns",
        "columns_format",
    }
)
