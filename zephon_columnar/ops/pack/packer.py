"""The packer contract shared by every algorithm, and `LanePacker`, the lane's accumulator.

A `Packer` packs one token stream (a lane's, or one domain group's within a lane). It is fed
runs (`stream.TokenRun`: documents already read from frames) and returns the rows it closed as
`Emission`s: an output frame plus, per row, the *trigger*: the index (in the pushed run) of the
document whose arrival closed the row. `LanePacker` reads frames, routes documents to one
packer per group (``homogeneity``), and orders rows of different groups by trigger, which is
what keeps the output independent of how documents were cut into frames.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import OversizedDocumentWarning, PassTailWarning
from zephon_columnar.losses import Notice, share_text
from zephon_columnar.ops.accumulators.lane import LaneContext
from zephon_columnar.ops.pack.emit import emit_rows
from zephon_columnar.ops.pack.sequences import PACKED
from zephon_columnar.ops.pack.spec import POSITIONS, PackSpec
from zephon_columnar.ops.pack.stream import TOKEN_SKIP, FrameReader, TokenRun, gather, is_list
from zephon_columnar.records import PYTHON_LISTS_KEY, as_python_lists
from zephon_columnar.references import concat_refs


def _packed_columns(schema: pa.Schema, docs: pa.Table) -> list[str]:
    """The token and aligned columns rows of ``schema`` were packed from: what ``pack_sequences``
    recorded, or the list columns of a ``pack_flat`` row that the documents have (a map after
    packing may have added others, which it computes again itself)."""
    from zephon_columnar.ops.pack.sequences import PACKED, PACKED_COLUMNS_KEY

    if PACKED in schema.names:
        meta = schema.field(PACKED).metadata or {}
        if PACKED_COLUMNS_KEY in meta:
            recorded: bytes = meta[PACKED_COLUMNS_KEY]
            return recorded.decode().split(",")
    names = [f.name for f in schema if f.name != POSITIONS and f.name in docs.column_names and is_list(f.type)]
    if not names:
        raise RuntimeError(f"cannot tell which columns rows of schema {schema} were packed from")
    return names


#: Lane counters (``ctx.stats``) of the packers: documents longer than max_length first_fit /
#: best_fit dropped (``drop_oversized=True``), and every non-empty document and token a packer
#: was given (dropped or placed), the denominators of the shares the losses are said as.
OVERSIZED_DOCS = "pack_oversized_docs"
OVERSIZED_TOKENS = "pack_oversized_tokens"
DOCS_SEEN = "pack_docs_seen"
TOKENS_SEEN = "pack_tokens_seen"
#: Lane counter: the tokens of the final partial rows uncapped wrap dropped at the ends of lanes.
DROPPED_FINAL_TOKENS = "pack_dropped_final_tokens"


def _arrow_type(name: str) -> pa.DataType:
    """An Arrow value type from its string form (``"int32"``, ``"bool"``, ``"float"``...)."""
    aliases = {"bool": "bool", "float": "float32", "double": "float64", "halffloat": "float16"}
    return pa.type_for_alias(aliases.get(name, name))


@dataclass
class Emission:
    """Rows a packer closed: ``frame`` (packed rows in order) and ``triggers`` (int64, one per
    row: the index in the pushed run of the document that closed it)."""

    frame: pa.Table
    triggers: np.ndarray


class LazyRun:
    """Documents a restored packer holds by reference, computed when a row first takes from
    them: only those documents, in one call (``materialize(refs) -> TokenRun``)."""

    def __init__(self, refs: pa.Table, materialize: Callable[[pa.Table], TokenRun]) -> None:
        self.refs = refs
        self._materialize = materialize
        self._done: dict[int, tuple[TokenRun, int]] = {}  # document -> (run holding it, its segment there)

    def resolve(self, segs: list[int]) -> list[tuple[TokenRun, int]]:
        missing = sorted({s for s in segs if s not in self._done})
        if missing:
            run = self._materialize(self.refs.take(pa.array(missing)))
            for k, s in enumerate(missing):
                self._done[s] = (run, k)
        return [self._done[s] for s in segs]


class HeldDocs:
    """The documents a bin packer holds, by run: each run a frame's documents (or, after a
    restore, a `LazyRun` of references), with how many held pieces still point into it, so a
    run is let go once nothing does.

    Example:
        >>> docs = HeldDocs()
        >>> rid = docs.add(object())  # a frame's run; its documents are not looked at here
        >>> docs.hold(rid, 2); docs.drop(rid); docs.release(); rid in docs.runs  # one piece still held
        True
        >>> docs.drop(rid); docs.release(); rid in docs.runs
        False
    """

    def __init__(self) -> None:
        self.runs: dict[int, TokenRun | LazyRun] = {}
        self._count: dict[int, int] = {}
        self._next = 0

    def add(self, run: TokenRun | LazyRun, held: int = 0) -> int:
        rid = self._next
        self._next += 1
        self.runs[rid] = run
        self._count[rid] = held
        return rid

    def hold(self, rid: int, n: int = 1) -> None:
        self._count[rid] += n

    def drop(self, rid: int, n: int = 1) -> None:
        self._count[rid] -= n

    def release(self) -> None:
        """Forget runs nothing points into any more."""
        for rid in [r for r, n in self._count.items() if n == 0]:
            del self._count[rid]
            del self.runs[rid]

    def refs(self, docs: list[tuple[int, int]]) -> pa.Table | None:
        """References of documents ``(run id, segment)``, in that order (no data computed)."""
        if not docs:
            return None
        parts = []
        for rid, seg in docs:
            held = self.runs[rid]
            if isinstance(held, LazyRun):
                parts.append(F.refs_of(held.refs.slice(seg, 1)))
            else:
                parts.append(F.refs_of(held.book.slice(int(held.seg_book[seg]), 1)))
        return F.concat_frames(parts).combine_chunks()

    def gather(self, pieces: list[tuple[int, int, int, int]]) -> TokenRun:
        """One run of ``pieces`` ``(run id, segment, start, length)``, in order; documents held by
        reference are computed here (only those the pieces need)."""
        runs = self.runs
        rids, segs, starts, lengths = np.array(pieces, np.int64).reshape(-1, 4).T
        used, inverse = np.unique(rids, return_inverse=True)
        if not any(isinstance(runs[int(r)], LazyRun) for r in used):  # the common case: all computed
            return gather([runs[int(r)] for r in used], inverse, segs, starts, lengths)  # type: ignore[misc]
        resolved: dict[tuple[int, int], tuple[TokenRun, int]] = {}
        for rid in {p[0] for p in pieces}:
            held = runs[rid]
            if isinstance(held, LazyRun):
                wanted = sorted({p[1] for p in pieces if p[0] == rid})
                for seg, where in zip(wanted, held.resolve(wanted)):
                    resolved[(rid, seg)] = where
        objects: list[TokenRun] = []
        position: dict[int, int] = {}
        run_index, seg_index = [], []
        for rid, seg, _, _ in pieces:
            run, local = resolved.get((rid, seg)) or (runs[rid], seg)
            k = position.setdefault(id(run), len(objects))
            if k == len(objects):
                objects.append(run)  # type: ignore[arg-type]
            run_index.append(k)
            seg_index.append(local)
        return gather(objects, np.array(run_index, np.int64), np.array(seg_index, np.int64), starts, lengths)


class Packer:
    """One stream's packing state. Subclasses implement `push` and `flush`; ``carry`` when
    they keep rows across a flush point; ``snapshot`` / ``restore`` for checkpoints by
    reference (``restore`` gets ``materialize(refs) -> TokenRun``, which computes documents again)."""

    def __init__(self, spec: PackSpec, ctx: LaneContext, emit: Callable[[TokenRun, np.ndarray], pa.Table]) -> None:
        self.spec = spec
        self.ctx = ctx
        self.emit = emit

    def push(self, run: TokenRun) -> list[Emission]:
        raise NotImplementedError

    def flush(self, *, end: bool) -> list[pa.Table]:
        """Emit what is held (rows in order) and become fresh, but for what `carry` returns."""
        raise NotImplementedError

    def carry(self) -> TokenRun | None:
        return None

    def snapshot(self) -> tuple[dict[str, Any], pa.Table | None]:
        raise NotImplementedError

    def restore(
        self, state: dict[str, Any], refs: pa.Table | None, materialize: Callable[[pa.Table], TokenRun]
    ) -> None:
        raise NotImplementedError

    def count(self, stat: str, n: int) -> None:
        self.ctx.stats[stat] = self.ctx.stats.get(stat, 0) + int(n)


class LanePacker:
    """The `LaneAccumulator` of ``pack_flat`` / ``pack_sequences``: frames -> runs -> one packer
    per group -> rows in trigger order."""

    def __init__(
        self,
        spec: PackSpec,
        ctx: LaneContext,
        make: Callable[[PackSpec, LaneContext, Any], Packer],
        *,
        op: str = "pack_flat",
        emit: Callable[[TokenRun, np.ndarray], pa.Table] | None = None,
        keep_payload: bool = False,
    ) -> None:
        self.spec = spec
        self.ctx = ctx
        self.op = op
        self.keep_payload = keep_payload
        self.reader = FrameReader(spec, op=op, keep_payload=keep_payload)
        self._emit_table = emit or (lambda run, lengths: emit_rows(spec, run, lengths, op=op))
        self._emit = lambda run, lengths: self._emit_read_by(self.reader, run, lengths)
        self._make = make
        self._packers: dict[Any, Packer] = {}
        names = ctx.component_names
        groups = spec.groups

        def group_of(component: int) -> Any:
            if spec.homogeneity == "full":
                return component
            if spec.homogeneity == "group" and groups is not None:
                return groups.group_of(names.get(component, str(component)))
            return None

        self._group_of = group_of
        self._window = _ShuffleWindow(spec, ctx) if spec.shuffle_strategy is not None else None
        self._skip = 0
        self._rewound_to: dict[str, Any] | None = None  # a rewind state restored, nothing pushed since

    def _emit_read_by(self, reader: FrameReader, run: TokenRun, lengths: np.ndarray) -> pa.Table:
        """Rows of ``run`` read by ``reader``: packed_samples keep the kind of the tokens that
        reader found (Python lists for tokenize's ids, `records.PYTHON_LISTS_KEY`)."""
        table = self._emit_table(run, lengths)
        return as_python_lists(table, [PACKED]) if reader.python_lists else table

    def _packer(self, group: Any) -> Packer:
        packer = self._packers.get(group)
        if packer is None:
            packer = self._packers[group] = self._make(self.spec, self.ctx, self._emit)
        return packer

    # ------------------------------------------------------------------ LaneAccumulator
    def push(self, frame: pa.Table) -> list[pa.Table]:
        run = self.reader.read(frame)
        if run is None:
            return []
        self._rewound_to = None
        if self._skip:  # restored by rewinding: these tokens went into rows already delivered
            if self._skip >= len(run):
                self._skip -= len(run)
                return []
            run, self._skip = run.sub(self._skip), 0
        # A carried frame (`carry()`, with its token skips) primes a fresh lane with rows that were
        # placed before the flush point: they go back to their packers, not through the window.
        carried = TOKEN_SKIP in frame.column_names
        if not carried:
            # Every document given, dropped or placed: what the losses are a share of (two numpy
            # sums per frame, no per-document work).
            lengths, stats = run.seg_lengths(), self.ctx.stats
            stats[DOCS_SEEN] = stats.get(DOCS_SEEN, 0) + len(lengths)
            stats[TOKENS_SEEN] = stats.get(TOKENS_SEEN, 0) + int(lengths.sum())
        if self._window is not None and not carried:
            out: list[pa.Table] = []
            for ready in self._window.push(run):
                out.extend(self._place(ready))
            return out
        return self._place(run)

    def _place(self, run: TokenRun) -> list[pa.Table]:
        oversized_before = self.ctx.stats.get(OVERSIZED_DOCS, 0)
        out = self._place_in_groups(run)
        if self.ctx.stats.get(OVERSIZED_DOCS, 0) > oversized_before:
            self._warn_oversized()
        return out

    def _warn_oversized(self) -> None:
        """Note (`zephon_columnar.losses`) that documents longer than max_length were dropped: said
        at the end of a pass with its totals, or at the first drop when the stream never ends (a
        source with ``stop_after_passes=None`` repeats forever, and a training loop usually stops
        after N steps, not at the end of the data)."""
        op, spec = self.op, self.spec

        def text(c: Mapping[str, int], scope: str) -> str:
            docs, tokens = c.get(OVERSIZED_DOCS, 0), c.get(OVERSIZED_TOKENS, 0)
            seen_docs, seen_tokens = c.get(DOCS_SEEN, 0), c.get(TOKENS_SEEN, 0)
            return (
                f"{op}(max_length={spec.max_length}, algorithm={spec.algorithm!r}) dropped {docs} of {seen_docs} "
                f"documents ({share_text(docs, seen_docs)}) and {tokens} of {seen_tokens} tokens "
                f"({share_text(tokens, seen_tokens)}) longer than max_length {scope} (counted in metrics_snapshot() "
                f"as {OVERSIZED_DOCS}/{OVERSIZED_TOKENS}, out of {DOCS_SEEN}/{TOKENS_SEEN}). To keep such documents, "
                "split them upstream (tokenize(split_long_samples=True)) or pack with algorithm='wrap' (or "
                "'best_fit_wrap'); to keep their first tokens, tokenize(max_length=..., truncation=True); to stop "
                "at the first one instead, pass drop_oversized=False."
            )

        self.ctx.notices.note(
            Notice(kind=f"{op}_oversized", category=OversizedDocumentWarning, text=text),
            self.ctx.stats,
            lane=self.ctx.lane,
        )

    def _place_in_groups(self, run: TokenRun) -> list[pa.Table]:
        if self.spec.homogeneity == "none":
            return [e.frame for e in self._packer(None).push(run)]
        components = run.book.column(F.COMPONENT).to_numpy()[run.seg_book]
        keys = [self._group_of(int(c)) for c in components.tolist()]
        emissions: list[tuple[np.ndarray, pa.Table]] = []
        order = list(dict.fromkeys(keys))
        key_array = np.array([order.index(k) for k in keys], np.int64)
        for g, key in enumerate(order):
            mine = np.flatnonzero(key_array == g)
            sub = gather(
                [run], np.zeros(len(mine), np.int64), mine, np.zeros(len(mine), np.int64), run.seg_lengths()[mine]
            )
            for e in self._packer(key).push(sub):
                emissions.append((mine[e.triggers], e.frame))
        if not emissions:
            return []
        if len(emissions) == 1:
            return [emissions[0][1]]
        triggers = np.concatenate([t for t, _ in emissions])
        table = F.concat_frames([f for _, f in emissions])
        return [table.take(pa.array(np.argsort(triggers, kind="stable")))]

    def flush(self, *, reset: bool, end: bool = False) -> list[pa.Table]:
        out: list[pa.Table] = []
        self._rewound_to = None
        dropped_before = self.ctx.stats.get(DROPPED_FINAL_TOKENS, 0)
        if self._window is not None:
            for ready in self._window.flush():
                out.extend(self._place(ready))
        for key in sorted(self._packers, key=repr):  # groups in a fixed order
            out.extend(self._packers[key].flush(end=end))
        carried = any(p.carry() is not None for p in self._packers.values())
        if end or not carried:
            # A fresh lane decides its packed columns again on its next document; a lane that
            # carries rows keeps the decisions they were read with (a fresh one primed with them
            # would make the same ones).
            self.reader.reset()
            self._packers = {}
        elif reset:
            self._packers = {k: p for k, p in self._packers.items() if p.carry() is not None}
        if end and self.ctx.stats.get(DROPPED_FINAL_TOKENS, 0) > dropped_before:
            self._note_final_row()
        return out

    def _note_final_row(self) -> None:
        """Note uncapped wrap's final partial row of a lane: a routine tail (`zephon_columnar.losses`),
        every lane of a pass ends with one, said once with the pass's totals."""
        op, max_length = self.op, self.spec.max_length

        def text(c: Mapping[str, int], scope: str) -> str:
            dropped, seen = c.get(DROPPED_FINAL_TOKENS, 0), c.get(TOKENS_SEEN, 0)
            return (
                f"{op}(algorithm='wrap') dropped {dropped} of {seen} tokens ({share_text(dropped, seen)}) {scope}, "
                f"each lane's final partial row (fewer than max_length={max_length}; uncapped wrap emits only full "
                f"rows). Counted in metrics_snapshot() as {DROPPED_FINAL_TOKENS}, out of {TOKENS_SEEN}. "
                "To keep them, use algorithm='best_fit_wrap' or a capped wrap (max_sequences_per_bin=...): both pad "
                "their final row instead."
            )

        def share(c: Mapping[str, int]) -> float:
            return c.get(DROPPED_FINAL_TOKENS, 0) / max(1, c.get(TOKENS_SEEN, 0))

        self.ctx.notices.note(
            Notice(kind="pack_wrap_final_row", category=PassTailWarning, text=text, share=share),
            self.ctx.stats,
            lane=self.ctx.lane,
        )

    # ------------------------------------------------------------------ checkpoints (by reference)
    def snapshot(self) -> tuple[dict[str, Any], pa.Table | None]:
        """The reader's decisions, each group's packer state, and the documents they hold (by
        reference, groups in order); restored from a rewind state and given nothing since, that
        state."""
        if self._rewound_to is not None:
            return dict(self._rewound_to), None
        r = self.reader
        reader = (
            None
            if r.dtypes is None
            else {"tokens": r.tokens, "fields": [[n, str(r.value_types[n])] for n in r.dtypes], "lists": r.python_lists}
        )
        groups, parts = [], []
        for key in sorted(self._packers, key=repr):
            state, refs = self._packers[key].snapshot()
            groups.append([key, state, 0 if refs is None else refs.num_rows])
            if refs is not None:
                parts.append(refs)
        window = None
        if self._window is not None and self._window.count:
            held = TokenRun.concat(self._window.held)
            parts.append(F.refs_of(held.book.take(pa.array(held.seg_book))))
            window = len(held.seg_starts)
        state = {"reader": reader, "groups": groups, "window": window}
        # The packers' refs carry their per-row state (`with_state`), the window's none: joined
        # with `concat_refs`, never null-filled (a checkpoint refuses nulls as damage).
        return state, concat_refs(parts) if parts else None

    def rewind(self, first_out: pa.Table | None) -> tuple[tuple[int, int] | None, dict[str, Any]]:
        """For a wrap packer whose input is the source one row per sample: where to read the
        input again from, ``(chunk, offset)`` of a document, so that a fresh packer that skips
        the first ``state["rewind"]`` tokens of it makes again all it holds and the rows
        ``first_out`` starts (its oldest rows not delivered yet); None when it holds nothing.
        Such a checkpoint is a few numbers, and restore computes only what the next rows need."""
        r = self.reader
        state: dict[str, Any] = {
            "rewind": 0,
            "reader": None
            if r.dtypes is None
            else {
                "tokens": r.tokens,
                "fields": [[n, str(r.value_types[n])] for n in r.dtypes],
                "lists": r.python_lists,
            },
            "groups": [],
            "window": None,
        }
        if first_out is not None and first_out.num_rows:
            seg = first_out.column(F.SEGMENTS)[0].as_py()[0]
            state["rewind"] = int(seg["start"])
            return (int(seg["chunk"]), int(seg["offset"])), state
        packer = self._packers.get(None)
        tail = packer.carry() if packer is not None else None
        if tail is None or not len(tail):
            return None, state
        book = tail.book.slice(int(tail.seg_book[0]), 1).to_pylist()[0]
        state["rewind"] = int(tail.seg_skip[0])
        return (int(book[F.CHUNK]), int(book[F.OFFSET])), state

    def skip_pending(self) -> bool:
        """Restored by rewinding, and the tokens delivered before the checkpoint not skipped yet
        (no document pushed since)."""
        return self._skip > 0

    def can_rewind(self) -> bool:
        s = self.spec
        return (
            s.algorithm == "wrap"
            and s.max_sequences_per_bin is None
            and s.homogeneity == "none"
            and s.shuffle_strategy is None
        )

    def restore(self, state: dict[str, Any], rows: pa.Table | None, source: Any) -> None:
        rewind = state.get("rewind", 0)
        if isinstance(rewind, bool) or not isinstance(rewind, int) or rewind < 0:
            raise ValueError(f"rewind = {rewind!r}, expected an int >= 0")
        self._skip = rewind
        self._rewound_to = dict(state) if "rewind" in state else None
        if state["reader"] is not None:
            saved = state["reader"]
            self._force_decisions(self.reader, saved["tokens"], saved["fields"], bool(saved.get("lists", False)))
        offset = 0
        for key, pstate, n in state["groups"]:
            refs = rows.slice(offset, n) if n and rows is not None else None
            offset += n
            self._packer(key).restore(pstate, refs, lambda r: self._read_docs(source(r)))
        if state["window"]:
            assert self._window is not None and rows is not None
            docs = self._read_docs(source(rows.slice(offset, state["window"])))
            self._window.held, self._window.count = [docs], len(docs.seg_starts)

    @staticmethod
    def _force_decisions(reader: FrameReader, tokens: str, fields: list[list[str]], python_lists: bool) -> None:
        from zephon_columnar.ops.pack.stream import np_dtype

        types = {name: _arrow_type(t) for name, t in fields}
        reader.tokens = tokens
        reader.python_lists = python_lists
        reader.value_types = types
        reader.dtypes = {name: np_dtype(t) for name, t in types.items()}

    def _read_docs(self, frame: pa.Table, reader: FrameReader | None = None) -> TokenRun:
        """Whole documents, one segment each, read with this lane's decisions."""
        run = (reader or self.reader).read(frame)
        if run is None or len(run.seg_starts) != frame.num_rows:
            raise RuntimeError(
                f"{self.op}: {frame.num_rows} documents computed again from a checkpoint gave "
                f"{0 if run is None else len(run.seg_starts)} non-empty ones; the operators before "
                "packing are not deterministic, or the data changed since the checkpoint."
            )
        return run

    def rebuild(self, refs: pa.Table, schema: pa.Schema | None, source: Any) -> pa.Table:
        """Packed rows from their references: their documents are computed again and cut by the
        rows' ``__segments``; ``schema`` names the packed columns (None: this lane's)."""
        if schema is None:
            # Rows held downstream (a shuffle after packing) were packed in this flush epoch,
            # with this packer's decisions (restored with its state).
            r = self.reader
            if r.dtypes is None:
                raise RuntimeError(f"{self.op}: asked to recompute packed rows with no packed columns decided")
            schema = pa.schema([(n, pa.list_(r.value_types[n])) for n in r.dtypes])
        segs = refs.column("__segments").to_pylist()
        lanes = refs.column(F.LANE).to_pylist()
        doc_of: dict[
            tuple[int, int, tuple[int, ...]], int
        ] = {}  # a document's (chunk, offset, lineage) -> its place in `book`
        cols: dict[str, list[Any]] = {
            n: [] for n in (F.LANE, F.CHUNK, F.OFFSET, F.DATASET, F.SHARD, F.ROW, F.COMPONENT, F.LINEAGE)
        }
        pieces: list[tuple[int, int, int]] = []
        row_lengths = []
        for lane, row in zip(lanes, segs):
            for seg in row:
                key = (seg["chunk"], seg["offset"], tuple(seg["lineage"]))
                if key not in doc_of:
                    doc_of[key] = len(doc_of)
                    for col, name in (
                        (F.CHUNK, "chunk"),
                        (F.OFFSET, "offset"),
                        (F.DATASET, "dataset"),
                        (F.SHARD, "shard"),
                        (F.ROW, "row"),
                        (F.COMPONENT, "component"),
                        (F.LINEAGE, "lineage"),
                    ):
                        cols[col].append(seg[name])
                    cols[F.LANE].append(lane)
                pieces.append((doc_of[key], seg["start"], seg["length"]))
            row_lengths.append(sum(seg["length"] for seg in row))
        book = pa.table(
            {
                F.LANE: pa.array(cols[F.LANE], pa.int32()),
                F.CHUNK: pa.array(cols[F.CHUNK], pa.int64()),
                F.OFFSET: pa.array(cols[F.OFFSET], pa.int32()),
                F.DATASET: pa.array(cols[F.DATASET], pa.int32()),
                F.SHARD: pa.array(cols[F.SHARD], pa.int32()),
                F.ROW: pa.array(cols[F.ROW], pa.int64()),
                F.COMPONENT: pa.array(cols[F.COMPONENT], pa.int32()),
                F.LINEAGE: pa.array(cols[F.LINEAGE], pa.list_(pa.int32())),
            }
        )
        docs = source(book)
        reader = FrameReader(self.spec, op=self.op, keep_payload=self.keep_payload)
        names = _packed_columns(schema, docs)
        self._force_decisions(
            reader,
            names[0],
            [[n, str(docs.schema.field(n).type.value_type)] for n in names],
            PYTHON_LISTS_KEY in (docs.schema.field(names[0]).metadata or {}),
        )
        run = self._read_docs(docs, reader)
        p = np.array(pieces, np.int64).reshape(-1, 3)
        cut = gather([run], np.zeros(len(p), np.int64), p[:, 0], p[:, 1], p[:, 2])
        # Emitted with the kind its own reader found in the documents: the lane's reader may have
        # been reset at a flush point since these rows were packed (it decides nothing then).
        return self._emit_read_by(reader, cut, np.array(row_lengths, np.int64))

    def carry(self) -> pa.Table | None:
        carried = (p.carry() for _, p in sorted(self._packers.items(), key=lambda kv: repr(kv[0])))
        runs = [r for r in carried if r is not None]
        if not runs:
            return None
        return F.concat_frames([r.to_frame(self.reader.tokens or "input_ids") for r in runs])


class _ShuffleWindow:
    """``shuffle_strategy``: documents are reordered within consecutive windows of `WINDOW`
    documents counted from the flush point ('random': by a hash of the seed, lane and each
    document's identity; 'length': longest first, ties in arrival order). Windows are counted in
    documents, never in frames, so frame sizes do not change the packing."""

    WINDOW = 64

    def __init__(self, spec: PackSpec, ctx: LaneContext) -> None:
        self.spec = spec
        self.ctx = ctx
        # The current window's documents and their count (the packer's checkpoint holds them).
        self.held: list[TokenRun] = []
        self.count = 0

    def push(self, run: TokenRun) -> list[TokenRun]:
        ready = []
        pos = 0
        n = len(run.seg_starts)
        while pos < n:
            take = min(self.WINDOW - self.count, n - pos)
            piece = run if (pos == 0 and take == n) else _segments(run, np.arange(pos, pos + take))
            self.held.append(piece)
            self.count += take
            pos += take
            if self.count == self.WINDOW:
                ready.append(self._release())
        return ready

    def flush(self) -> list[TokenRun]:
        return [self._release()] if self.count else []

    def _release(self) -> TokenRun:
        run = TokenRun.concat(self.held)
        self.held, self.count = [], 0
        n = len(run.seg_starts)
        if self.spec.shuffle_strategy == "length":
            order = np.argsort(-run.seg_lengths(), kind="stable")
        else:
            book = run.book.take(pa.array(run.seg_book))
            keys = F.mix64(
                F.row_keys(book) ^ F.mix64(np.full(n, self.spec.shuffle_seed * 0x9E3779B1 + self.ctx.lane, np.uint64))
            )
            order = np.argsort(keys, kind="stable")
        return _segments(run, order)


def _segments(run: TokenRun, index: np.ndarray) -> TokenRun:
    """The whole segments ``index`` of ``run``, in that order (a copy)."""
    return gather(
        [run], np.zeros(len(index), np.int64), index, np.zeros(len(index), np.int64), run.seg_lengths()[index]
    )
