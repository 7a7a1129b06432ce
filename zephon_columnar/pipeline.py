"""`Pipeline`: the fluent builder users see (Zephon's API) over the columnar engine.

Example:
    >>> from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
    >>> ws = StaticMixtureWorkSource([Dataset.from_path("web", "data/web")], {"web": 1.0}, chunk_size=16, seed=0)
    >>> pipe = Pipeline(ws).filter(pl.col("text").str.len_chars() > 80).batch(2)
    >>> for step, batch in enumerate(pipe):
    ...     texts = batch.to_pydict()["text"]
    ...     if step == 1:
    ...         state = pipe.checkpoint()  # JSON-serializable: restore() it into a fresh pipeline
    >>> resumed = Pipeline(ws).filter(pl.col("text").str.len_chars() > 80).batch(2)
    >>> resumed.restore(state)
    >>> [b.to_pydict()["text"] for b in resumed][-1] == texts  # it goes on after step 1, to the same end
    True

Builder methods change the pipeline in place and return it: each replaces its `PipelineSpec`
(``pipe.spec``: work source, operators, options; `zephon_columnar.engine.spec`). Running it is
its `Session`'s work (``pipe.session``: passes, checkpoints, restores, counters;
`zephon_columnar.session`), to which iteration, checkpoints and metrics delegate. Iterating
yields `SampleBatch`es once `batch()` is in the plan, else `SampleRecord`s; iterating again
starts from the beginning unless `restore()` was called.
"""

import copy
import dataclasses
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from zephon_columnar.compatibility import PLACEMENT, PLACEMENTS
from zephon_columnar.engine.checkpoint import (
    checkpoint_bytes,
    merge_checkpoints,
)
from zephon_columnar.engine.indexed import IndexedPipeline, indexing_obstacle
from zephon_columnar.engine.spec import PipelineSpec
from zephon_columnar.errors import (
    ConfigError,
    WrongTypeError,
    warn,
)
from zephon_columnar.keywords import suggest_keywords_of
from zephon_columnar.observability import (
    FetchTimingSummary,
    PrefetchTimingSummary,
)
from zephon_columnar.ops.base import BaseOp
from zephon_columnar.ops.batch import BatchOp
from zephon_columnar.ops.config import (
    FlushStrategy,
    Homogeneity,
    LoaderKind,
    LossScope,
    MissingFieldMode,
    PackingAlgorithm,
    ShuffleAlgorithm,
    ShuffleStrategy,
    SpanSource,
    SpecialTokensMode,
    TokenizerBackend,
)
from zephon_columnar.ops.fetch import FetchOp
from zephon_columnar.ops.map import FilterOp, MapBatchOp, MapOp, MaterializeOp
from zephon_columnar.ops.user import FunctionOp
from zephon_columnar.options import OptionHints, RuntimeOptions
from zephon_columnar.records import SampleRecord
from zephon_columnar.session import Session
from zephon_columnar.validation import (
    ValidationError,
    ValidationReport,
    preflight_tokenizers,
    validate_ops,
)
from zephon_columnar.work.base import WorkSource
from zephon_columnar.work.schedule import MixtureChange

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # a dependency of torch's
    from typing_extensions import Unpack


def _op_arguments(call_locals: Mapping[str, Any], *, leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
    """The keyword arguments a builder hands its operator: the builder's own arguments
    (``locals()`` taken before anything else), less ``self``, ``placement`` (the builder's) and
    ``leave_out``. A builder's signature and its operator's ``__init__`` are held equal by
    ``tests/test_builder_signatures.py``, so an argument is written twice, never forwarded by hand.
    """
    return {k: v for k, v in call_locals.items() if k not in ("self", "placement", *leave_out)}


@suggest_keywords_of  # a misspelt keyword names the one meant (`zephon_columnar.keywords`)
class Pipeline:
    """Fluent builder: work source -> fetch -> your transforms -> batch -> training loop."""

    def __init__(self, work_source: WorkSource) -> None:
        if not isinstance(work_source, WorkSource):
            raise ConfigError(
                f"Pipeline(work_source): got {type(work_source).__name__}; pass a WorkSource "
                "such as StaticMixtureWorkSource(datasets, mixture)."
            )
        self._session = Session(PipelineSpec(work_source=work_source, ops=(FetchOp(),), options=RuntimeOptions()))

    @property
    def spec(self) -> PipelineSpec:
        """What a run of this pipeline is built from, as built so far: the work source, the
        operators (fetch first) and the options (`zephon_columnar.engine.spec`)."""
        return self._session.spec

    @property
    def session(self) -> Session:
        """What runs the pipeline: its passes, checkpoints and restores (`zephon_columnar.session`)."""
        return self._session

    # ------------------------------------------------------------------ builder
    def _respec(self, what: str, **changes: Any) -> "Pipeline":
        """Replace fields of the spec (refused while iterating; ``what``: the call, for the message)."""
        self._session.use(dataclasses.replace(self.spec, **changes), what=what)
        return self

    def _add(self, op: BaseOp, *, placement: str = "auto") -> "Pipeline":
        what = f"{op.op_name()}()"
        self._session.refuse_while_iterating(what)
        if any(isinstance(o, BatchOp) for o in self.spec.ops):
            raise ConfigError(
                f"{op.op_name()}() after batch(): only map_batch may follow batch(); add {op.op_name()} before batch()."
            )
        return self._respec(what, ops=(*self.spec.ops, op), ignored=self._placed(op.op_name(), placement))

    def _placed(self, call: str, placement: str, default: str = "auto") -> tuple[str, ...]:
        """The spec's ``ignored`` with a line for ``call(placement=...)`` when it names a
        placement (accepted for Zephon, no effect: `zephon_columnar.compatibility`)."""
        if placement not in PLACEMENTS:
            raise ConfigError(
                f"{call}(placement={placement!r}): use one of {list(PLACEMENTS)} (it has no effect here: {PLACEMENT})."
            )
        if placement == default:
            return self.spec.ignored
        return (*self.spec.ignored, f"{call}(placement={placement!r}): {PLACEMENT}")

    def fetch(self, parallelism: int | None = None, max_batch: int | None = None) -> "Pipeline":
        """Set the implicit fetch's worker count and rows per read (a performance knob only)."""
        for name, v in (("parallelism", parallelism), ("max_batch", max_batch)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ConfigError(f"fetch({name}={v!r}): pass a positive int or None.")
        return self._respec("fetch()", ops=(FetchOp(parallelism=parallelism, max_batch=max_batch), *self.spec.ops[1:]))

    fetch_parallelism = fetch  # Zephon's alias of ``fetch(parallelism, max_batch)``

    def prefetch(
        self, buffer_size: int = 1024, parallelism: int | None = None, *, placement: str = "local"
    ) -> "Pipeline":
        """Warm a local cache of remote shards ahead of fetch (background downloads).

        Never changes the data; local files are read in place and need no prefetch.
        """
        if buffer_size < 1 or (parallelism is not None and parallelism < 1):
            raise ConfigError(f"prefetch(buffer_size={buffer_size}, parallelism={parallelism}): pass positive ints.")
        return self._respec(
            "prefetch()",
            prefetch=(buffer_size, parallelism or 4),
            ignored=self._placed("prefetch", placement, default="local"),
        )

    def materialize(self, placement: str = "auto", parallelism: int | None = None) -> "Pipeline":
        return self._add(MaterializeOp(parallelism), placement=placement)

    def map_transform(
        self, fn: Any, *, drop_none: bool = True, placement: str = "auto", parallelism: int | None = None
    ) -> "Pipeline":
        """Transform rows: ``fn(payload) -> payload | None`` (None drops the row), or Polars
        expression(s) applied with ``with_columns`` to whole frames (the fast path).

        Example:
            >>> upper = Pipeline(ws).map_transform(pl.col("text").str.to_uppercase())
            >>> next(iter(upper)).payload["text"].isupper()
            True
            >>> long_only = Pipeline(ws).map_transform(lambda p: p if len(p["text"]) > 80 else None)
            >>> sum(1 for _ in long_only), sum(1 for _ in Pipeline(ws))
            (19, 32)
        """
        return self._add(MapOp(fn, parallelism=parallelism, drop_none=drop_none), placement=placement)

    def filter(self, predicate: Any, *, placement: str = "auto", parallelism: int | None = None) -> "Pipeline":
        """Keep rows where ``predicate`` holds: a boolean Polars expression, a
        ``pyarrow.compute.Expression``, or ``fn(payload) -> bool``."""
        return self._add(FilterOp(predicate, parallelism=parallelism), placement=placement)

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
        ids (the extra ``fast``), else ``tokenizers`` (`zephon_columnar.ops.tokenize.backend`).

        Example:
            >>> first = next(iter(Pipeline(ws))).payload["text"]
            >>> row = next(iter(pipe.tokenize(tokenizer_id="tok/", field="text", special_tokens="eos")))
            >>> ids = row.payload["input_ids"]
            >>> tok.decode(ids[:-1]) == first, ids[-1] == tok.token_to_id("</s>")
            (True, True)
        """
        arguments = _op_arguments(locals())
        from zephon_columnar.ops.tokenize.op import TokenizeOp

        return self._add(TokenizeOp(**arguments), placement=placement)

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
            >>> chat = StaticMixtureWorkSource([Dataset.from_path("chat", "data/chat")], {"chat": 1.0}, chunk_size=8)
            >>> row = next(iter(Pipeline(chat).tokenize_chat(tokenizer_id="tok/", chat_template="chat.jinja")))
            >>> sorted(row.payload)
            ['input_ids', 'loss_mask']
        """
        arguments = _op_arguments(locals())
        from zephon_columnar.ops.chat import TokenizeChatOp

        return self._add(TokenizeChatOp(**arguments), placement=placement)

    def expand_chat(
        self, *, field: str = "messages", placement: str = "auto", parallelism: int | None = None
    ) -> "Pipeline":
        """One row per answered user turn of each conversation in ``field``: the conversation up
        to (not including) the next user message (`zephon_columnar.ops.expand_chat`).

        Example:
            >>> chat = StaticMixtureWorkSource([Dataset.from_path("chat", "data/chat")], {"chat": 1.0}, chunk_size=8)
            >>> sum(1 for _ in Pipeline(chat)), sum(1 for _ in Pipeline(chat).expand_chat(field="messages"))
            (8, 9)
        """
        from zephon_columnar.ops.expand_chat import ExpandChatOp

        return self._add(ExpandChatOp(field=field, parallelism=parallelism), placement=placement)

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
        arguments = _op_arguments(locals())
        from zephon_columnar.ops.shuffle import ShuffleOp

        return self._add(ShuffleOp(**arguments), placement=placement)

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
        arguments = _op_arguments(locals())
        from zephon_columnar.ops.ensure_mixture import EnsureMixtureOp

        return self._add(EnsureMixtureOp(**arguments), placement=placement)

    def stateful_transform(
        self,
        name: str,
        *,
        init_state: Callable[[], Any],
        push: Callable[[Any, list[SampleRecord]], tuple[Any, list[SampleRecord]]],
        flush: Callable[[Any], list[SampleRecord]] | None = None,
        should_flush: Callable[[Any], bool] | None = None,
        transform: Callable[[list[SampleRecord]], list[SampleRecord]] | None = None,
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
            ),
            placement=placement,
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
        algorithm: PackingAlgorithm | None = None,
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
        ``"best_fit_wrap"`` (a candidate pool, at most one split per row). None (the default):
        ``"first_fit"`` when ``num_bins`` is given (Zephon's default), else ``"wrap"``
        (``pack_flat(2049)`` alone packs without failing or dropping documents). Leftover non-token
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
        arguments = _op_arguments(locals())
        from zephon_columnar.ops.pack import PackFlatOp

        self._check_groups(groups)
        return self._add(PackFlatOp(**arguments), placement=placement)

    def pack_sequences(
        self,
        max_length: int,
        *,
        num_bins: int | None = None,
        max_sequences_per_bin: int | None = None,
        algorithm: PackingAlgorithm | None = None,
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
        arguments = _op_arguments(locals(), leave_out=("length_fn",))
        from zephon_columnar.ops.pack import PackSequencesOp
        from zephon_columnar.ops.pack.sequences import merge_with

        self._check_groups(groups)
        if length_fn is not None:
            raise ConfigError(
                "pack_sequences(length_fn=...): packing measures the token field's length here; "
                "pass tokens_field=<the list column to measure> instead (a length field that is "
                "not a list is not supported)."
            )
        self._add(PackSequencesOp(**arguments), placement=placement)
        if callable(pack_payloads):
            self._add(MapOp(merge_with(pack_payloads), parallelism=parallelism))
        return self

    def _check_groups(self, groups: Any) -> None:
        """``groups`` (for ``homogeneity="group"``) must name mixture components."""
        if groups is None:
            return
        from zephon_columnar.ops.pack import DomainGroups

        g = groups if isinstance(groups, DomainGroups) else DomainGroups(groups)
        names = list(self.spec.work_source.component_ids())
        g.validate_against(names)
        loose = sorted(set(names) - set(g.to_member_map()))
        if loose:
            warn(f"pack_flat(groups=...): components {loose} are in no group; each packs on its own.")

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
          ``calibration_replayable``, ``emits`` (`OpTraits.emits`: ``"one"`` or
          ``"at_most_one"`` row per input row lets a checkpoint resume without replaying; not in
          Zephon); or ``process_columns=fn`` (the columnar hook, with
          ``columns_format="arrow"|"polars"``) instead of ``process_many``.

        The engine deep-copies the op per worker and calls ``setup`` once per copy, on every
        runner; the accumulator groups each lane's records into calls (see
        `zephon_columnar.ops.user`). ``placement`` is accepted for Zephon compatibility and has
        no effect: every stage runs on the pipeline's runner (``options(runner=...)``).
        """
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
            return self._add(op, placement=placement)
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
            ),
            placement=placement,
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
            >>> full = pipe.batch(6, drop_last=False).map_batch(lambda b: b if len(b) == 6 else None)
            >>> [len(b) for b in full], [len(b) for b in Pipeline(ws).batch(6, drop_last=False)]
            ([6, 6, 6, 6, 6], [6, 6, 6, 6, 6, 2])
        """
        self._session.refuse_while_iterating("map_batch()")
        if not any(isinstance(o, BatchOp) for o in self.spec.ops):
            raise ConfigError(
                "map_batch() before batch(): map_batch transforms SampleBatches; call batch() first, "
                "or use map_transform to transform records."
            )
        ignored = self._placed("map_batch", placement)
        if parallelism is not None:
            ignored = (*ignored, f"map_batch(parallelism={parallelism!r}): map_batch runs in the iterating thread")
        return self._respec("map_batch()", ops=(*self.spec.ops, MapBatchOp(fn, drop_none=drop_none)), ignored=ignored)

    def batch(self, microbatch_size: int, *, drop_last: bool = True, placement: str = "auto") -> "Pipeline":
        """Group each lane's rows into `SampleBatch`es of ``microbatch_size`` (lane-pure).
        ``drop_last=False`` also emits each lane's short final batch."""
        return self._add(BatchOp(microbatch_size, drop_last=drop_last), placement=placement)

    def options(self, **hints: Unpack[OptionHints]) -> "Pipeline":
        """Set `RuntimeOptions` fields; an unknown name raises, listing the valid ones (an editor
        completes and checks the names and types: `OptionHints`)."""
        self._session.refuse_while_iterating("options()")
        return self._respec("options()", options=self.spec.options.updated(**hints))

    # ------------------------------------------------------------------ inspection
    def explain(self) -> str:
        """The compiled stages, runner, parallelism, lanes, queue sizes and how checkpoints
        resume; after a run, its counters (``metrics_snapshot``)."""
        return self._session.explain()

    def metrics_snapshot(self) -> Any:
        """Counters of the current (or last) run: one record per lane and counter (tokens uncapped
        wrap dropped at the end of a lane, ``pack_dropped_final_tokens``; documents and tokens
        first_fit / best_fit dropped as longer than ``max_length``, ``pack_oversized_docs`` /
        ``pack_oversized_tokens``, out of those they were given, ``pack_docs_seen`` /
        ``pack_tokens_seen``; rows exact ``ensure_mixture`` dropped, ``ensure_mixture_dropped``:
        what the pass's `~zephon_columnar.errors.DataDroppedWarning` s were about); the realized
        mixture, per component ``<name>``: ``component_rows_read.<name>`` (rows the lane read),
        ``component_rows_delivered.<name>`` (rows delivered; a packed row counts each document
        it ends) and ``component_tokens_delivered.<name>`` (packed rows' tokens), which
        `~zephon_columnar.errors.StarvedComponentWarning` is about; with
        `enable_observability`, one per operator (``stage``, ``index``, ``op``, ``calls``,
        ``rows_in``/``rows_out``, ``bytes_in``/``bytes_out``, ``busy_s``; ordered stages have
        ``stage == "ordered"``) and one per parallel stage (``wait_s``: the lanes' time blocked
        on its results; ``in_flight``, ``max_in_flight``: frames). None before any run."""
        return self._session.metrics_snapshot()

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
        return self._session.fetch_timing_snapshot()

    def prefetch_timing_snapshot(self) -> PrefetchTimingSummary | None:
        """``prefetch()``'s shard downloads as Zephon's `PrefetchTimingSummary` (stage 0: prefetch
        runs in the lane sources, ahead of the first stage): chunks of pointers seen, shards
        submitted, downloaded (with their bytes and seconds), failed; None without ``prefetch()``
        or a run."""
        return self._session.prefetch_timing_snapshot()

    def inflight_summary(self) -> dict[int, dict[int, int]] | None:
        """``{parallel stage: {lane: frames submitted and not yet taken}}`` now; None without
        tracking or a run."""
        return self._session.inflight_summary()

    @property
    def ws(self) -> WorkSource:
        """The work source the pipeline reads (Zephon's public attribute)."""
        return self.spec.work_source

    @property
    def _ws(self) -> WorkSource:
        # Zephon's private name, which clients' tests read (TorchTitan's among them).
        return self.spec.work_source

    @property
    def is_indexable(self) -> bool:
        """Whether `to_indexable_torch_dataset` works: every operator is 1:1, stateless and keeps
        order (``indexable`` in its traits), and the work source's stream is finite (a
        ``StaticMixtureWorkSource`` unless it repeats forever; Zephon's never is)."""
        return indexing_obstacle(self.spec.work_source, self.spec.ops) is None

    def validate(self, *, strict: bool = False) -> ValidationReport:
        """Run the validation harness on the operators added with ``add_op`` (built-ins are
        skipped): determinism, cross-call state, output types, sample ids and lineage, the
        accumulator contract, and a static scan for writes to ``self`` and unseeded randomness,
        with Zephon 0.2.0's issue codes (`zephon_columnar.validation`). ``strict=True`` raises
        `ValidationError` listing every problem. The first ``iter()`` runs it too
        (``options(auto_validation="strict"|"warn"|"off")``)."""
        report = validate_ops(list(self.spec.ops))
        if strict and not report.ok:
            raise ValidationError(report)
        return report

    def preflight_tokenizers(self, *, strict: bool = True) -> ValidationReport:
        """Load every configured tokenizer in a copy of its operator and encode a probe; a
        `ValidationReport` with a ``TOKENIZER_PREFLIGHT_FAILED`` issue per failure (raises
        `ValidationError` when ``strict``)."""
        report = preflight_tokenizers(self)
        if strict and not report.ok:
            raise ValidationError(report)
        return report

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[Any]:
        return self._session.iterate()

    def set_epoch(self, epoch: int) -> "Pipeline":
        """Read training epoch ``epoch`` from the next iteration on: the same data, mixture and
        operators, with the work source's order (shards, rows, shuffle blocks, lane deal)
        seeded by its seed and the epoch; epoch 0 is the pipeline as built. Without it every
        iteration repeats the same order (a pass from the start); this is the ``set_epoch`` of
        torch's samplers and HF datasets. Several passes in one iteration, each reshuffled, is
        ``StaticMixtureWorkSource(stop_after_passes=N)`` instead. A checkpoint records the
        epoch: restore it after the same ``set_epoch``. Refused while iterating.

        Example:
            >>> texts = lambda pipe: [b.table["text"].to_pylist() for b in pipe]
            >>> pipe = Pipeline(StaticMixtureWorkSource([ds], {"web": 1.0}, seed=0, shuffle_within_shard=True)).batch(4)
            >>> first, again, later = texts(pipe), texts(pipe), texts(pipe.set_epoch(1))
            >>> first == again, first == later, sorted(sum(first, [])) == sorted(sum(later, []))
            (True, False, True)
        """
        self._session.set_epoch(epoch)
        return self

    def set_mixture(self, weights: Mapping[str, float]) -> MixtureChange:
        """Change the mixture of a `ScheduledMixtureWorkSource` during training: ``weights``
        (``{component: weight}``, normalized; a component left out weighs 0) govern the stream
        from the returned change's ``at``, the first global chunk nothing delivered so far
        depends on, until the schedule's next point. ``at`` follows from the delivered stream
        alone (the flush epoch each lane's last item belongs to), so it is the same whatever the
        runner, prefetch depth or ``mtp_mode``; the change is part of every later checkpoint.
        During a pass the engine restarts from the delivered position (as a restore does) and
        the open iterator goes on. A collective: every data-parallel rank calls it at the same
        step with the same weights (ranks asked different ones raise ``RuntimeError``).

        Example:
            >>> from zephon_columnar import ScheduledMixtureWorkSource, SchedulePoint
            >>> web = Dataset.from_dict("web", {0: [{"t": "w"}] * 100})
            >>> code = Dataset.from_dict("code", {0: [{"t": "c"}] * 100})
            >>> ws = ScheduledMixtureWorkSource([web, code], [SchedulePoint(at=0, weights={"web": 1.0, "code": 0.0})],
            ...                                 chunk_size=4, exhausted_policy="repeat", stop_after_passes=None)
            >>> pipe = Pipeline(ws).shuffle(4, seed=0).batch(4).options(flush_every_k_chunks=2)
            >>> batches = iter(pipe)
            >>> first = [next(batches) for _ in range(3)]   # chunks 0-2: flush epochs 0 and 1
            >>> pipe.set_mixture({"web": 1.0, "code": 1.0})   # from flush epoch 2, chunk 4
            MixtureChange(at=4, weights={'web': 1.0, 'code': 1.0})
            >>> [next(batches).table["t"].to_pylist().count("c") for _ in range(6)]  # code rows per batch
            [0, 1, 3, 2, 2, 1]
        """
        return self._session.set_mixture(weights)

    def show_progress(self, every_s: float = 10.0, *, file: Any = None, use_tqdm: bool | None = None) -> "Pipeline":
        """Report progress while iterating: items, tokens, tokens/s and each lane's position,
        every ``every_s`` seconds and at the end (`zephon_columnar.progress`; through tqdm when
        installed, else a line on stderr). ``every_s=None`` turns it off."""
        self._session.show_progress(every_s, file=file, use_tqdm=use_tqdm)
        return self

    def mtp_queue_stats(self) -> dict[str, int] | None:
        """With ``options(mtp_mode=True)`` and an open iterator: items ready in the shared-memory
        ring (``depth``) against its ``capacity`` (``mtp_buffer``), and their ``staged_bytes``
        against ``capacity_bytes`` (``mtp_buffer_bytes``). None otherwise."""
        return self._session.mtp_queue_stats()

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self, *, as_bytes: bool = False, collective: bool = True) -> dict[str, Any] | bytes:
        """A JSON-serializable state of what has been delivered so far (size independent of
        how far the stream went). With several data-parallel ranks it merges every rank's
        lanes through ``options(aggregate_dir=...)`` or ``torch.distributed`` (every rank calls
        it at the same step); without either it returns this rank's lanes with a
        `~zephon_columnar.errors.ConfigurationWarning` (merge them with
        `Pipeline.merge_checkpoints`). ``collective=False``: this rank's lanes, on purpose, no
        merging and no warning (ranks simulated in one process, a merge of your own).

        Plain Python types only, so ``pickle.dumps``, ``json.dumps`` and ``torch.save`` /
        ``torch.load(weights_only=True)`` all store it. ``as_bytes=True`` (Zephon 0.2.1):
        compact bytes (zstandard-compressed JSON) that ``restore`` takes as they are."""
        ckpt = self._session.checkpoint(collective=collective)
        return checkpoint_bytes(ckpt) if as_bytes else ckpt

    merge_checkpoints = staticmethod(merge_checkpoints)

    def restore(self, ckpt: Mapping[str, Any] | str | bytes) -> None:
        """Continue from ``ckpt`` (a dict from ``checkpoint()``, its JSON text, or the bytes of
        ``checkpoint(as_bytes=True)``) at the next iteration, exactly where it was taken.

        Raises `CheckpointError` if the checkpoint is malformed, lacks lanes this rank owns,
        or was taken with another recipe (seed, mixture, chunk size, lanes, operators).
        """
        self._session.restore(ckpt)

    # ------------------------------------------------------------------ torch
    def to_torch_dataset(self, stateful: bool = True, **to_training: Any) -> Any:
        """A ``torch.utils.data.IterableDataset`` over this pipeline (use ``batch_size=None``).

        ``state_dict()`` / ``load_state_dict()`` work under a plain ``DataLoader`` with
        ``num_workers=0`` (the pipeline has its own workers) and under torchdata's
        ``StatefulDataLoader`` with any ``num_workers``; loader workers split this rank's lanes
        (`zephon_columnar.torch`). Keyword arguments, if any, are ``SampleBatch.to_training``'s,
        checked here (a misspelt one is a TypeError naming the closest) and applied to each
        batch; the dataset then yields `~zephon_columnar.torch.LoaderBatch` dicts. A token-unit
        mixture is primed here, in the calling process (as in Zephon), not in each loader worker.
        `to_torch_loader` builds the loader around it.
        """
        from zephon_columnar.training import TrainingOptions

        options = TrainingOptions.from_keywords(to_training, where="to_torch_dataset") if to_training else None
        return self._torch_dataset(stateful=stateful, to_training=options)

    def _torch_dataset(self, *, stateful: bool, to_training: Any) -> Any:
        from zephon_columnar.torch import PipelineIterableDataset

        # Here, once, in the trainer: loader workers have no process group to see, and get the primed source.
        self._session.prepare()
        return PipelineIterableDataset(self._session, stateful=stateful, to_training=to_training)

    def to_torch_loader(
        self,
        *,
        num_workers: int = 0,
        loader: LoaderKind = "auto",
        multiprocessing_context: str | None = "spawn",
        timeout: float = 0,
        pin_memory: bool = False,
        prefetch: int | None = None,
        raw_batches: bool = False,
        **to_training: Any,
    ) -> Any:
        """A torch loader over this pipeline, built as it must be: ``batch_size=None`` (the
        pipeline batches), ``num_workers`` loader workers splitting this rank's lanes, started
        with ``multiprocessing_context`` (default ``"spawn"``: a forked worker inherits Polars'
        and the tokenizer's thread pools half-initialized), each batch converted to training
        tensors by ``SampleBatch.to_training(**to_training)`` (its keywords; none: its defaults,
        ``input_ids`` and, for packed rows, ``positions``). ``raw_batches=True``: the
        `~zephon_columnar.types.SampleBatch` objects themselves (no to_training keywords then).

        ``loader``: ``"stateful"`` is torchdata's ``StatefulDataLoader`` (``loader.state_dict()``
        / ``load_state_dict()`` resume exactly, with any ``num_workers``; needs ``torchdata``),
        ``"plain"`` torch's ``DataLoader`` (checkpoint through ``loader.dataset.state_dict()``,
        with ``num_workers=0`` only), ``"auto"`` the stateful one when torchdata is installed.

        With a ``device`` keyword (``device="cuda"``) the loader is a
        `~zephon_columnar.device.DeviceLoader` around that one: each batch is staged in a reused
        ring of pinned host buffers and copied on a side CUDA stream, ``prefetch`` batches (default
        2) ahead of the one the trainer holds; integers cross in their own dtype (int32 token
        ids) and are widened on the device. Its ``state_dict()`` is the position after the last
        batch handed over. ``pin_memory`` is torch's (pinned host batches, without ``device``).

        Example:
            >>> pipe = pipe.tokenize(tokenizer_id="tok/", field="text", special_tokens="eos")
            >>> loader = pipe.pack_flat(65, algorithm="wrap").batch(4).to_torch_loader(return_labels=True)
            >>> step = next(iter(loader))
            >>> type(loader).__name__, step["input_ids"].shape, step["labels"].shape
            ('StatefulDataLoader', torch.Size([4, 64]), torch.Size([4, 64]))
        """
        from zephon_columnar.torch import build_loader
        from zephon_columnar.training import TrainingOptions

        if raw_batches and to_training:
            raise TypeError(
                f"to_torch_loader(raw_batches=True, {', '.join(sorted(to_training))}=...): raw batches are not "
                "converted; drop raw_batches to get tensors, or the to_training keywords to get the batches."
            )
        own = [n for n in inspect.signature(Pipeline.to_torch_loader).parameters if n not in ("self", "to_training")]
        options = None if raw_batches else TrainingOptions.from_keywords(to_training, where="to_torch_loader", own=own)
        return build_loader(
            self._torch_dataset(stateful=True, to_training=options),
            loader=loader,
            num_workers=num_workers,
            multiprocessing_context=multiprocessing_context,
            timeout=timeout,
            pin_memory=pin_memory,
            prefetch=prefetch,
        )

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

        self._session.auto_validate()
        return PipelineMapDataset(IndexedPipeline(self.spec))

    def __repr__(self) -> str:
        """What the pipeline reads and what it does to it, in order.

        Example:
            >>> pipe.pack_flat(65, algorithm="wrap").batch(4)  # doctest: +NORMALIZE_WHITESPACE
            Pipeline(StaticMixtureWorkSource({'web': 1.0}, chunk_size=16, seed=0, next chunk 0)
                     -> fetch -> pack_flat -> batch)
        """
        steps = " -> ".join(op.op_name() for op in self.spec.ops)
        return f"Pipeline({self.spec.work_source!r} -> {steps}{', iterating' if self._session.iterating else ''})"

    def __copy__(self) -> "Pipeline":
        twin = type(self).__new__(type(self))
        twin._session = copy.copy(self._session)  # noqa: SLF001 - a new pipeline of this class
        return twin


_ADD_OP_KWARGS = frozenset(
    {
        "accumulator",
        "process_one",
        "validation_samples",
        "indexable",
        "batch_shape_sensitive",
        "requires_serial_state",
        "calibration_replayable",
        "emits",
        "process_columns",
        "columns_format",
    }
)
