"""A progress readout for long runs: ``pipeline.show_progress()``, then iterate as usual.

Every ``every_s`` seconds (and at the end of the pass) one line: items and rows delivered; their
tokens, real (what the documents hold) and padded (what the trainer's tensors hold: a batch's rows
at its longest row's length), the padding share and the rate of each; where the stream is in its
pass and an ETA (from the work source's rows per pass; the position is the furthest row
delivered, from its chunk and its place in the chunk); the mixture delivered: each component's
share of the documents delivered, next to its target weight; each lane's position. On a terminal with
tqdm installed it is the postfix of a bar; elsewhere (a log file, a job's captured output) a plain
line.

Under DataLoader workers the trainer process shows the one readout: each worker adds its counts
to memory the loader shares (`SharedCounts`), and a thread of the trainer process reports their
sum (`zephon_columnar.torch`).

Example:
    >>> import io
    >>> from zephon_columnar.types import SampleBatch
    >>> from zephon_columnar.frame import frame_of
    >>> out = io.StringIO()
    >>> p = Progress(every_s=3600, file=out, use_tqdm=False, stream=StreamShape(rows_per_pass=8, chunk_size=4))
    >>> p.update(SampleBatch(frame_of({"input_ids": [[1, 2, 3], [4]]})))
    >>> p.close()
    >>> line = out.getvalue().split(" | ")
    >>> line[:2], line[3]
    (['zephon_columnar: 1 items, 2 rows', '4 tokens (6 padded: 33.3% padding)'], 'pass 1: 25% of 8 rows')
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import astuple, dataclass, fields
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zephon_columnar import frame as F
from zephon_columnar.engine.realized import MixtureCounts
from zephon_columnar.records import SampleRecord
from zephon_columnar.training import TOKEN_FIELD_CANDIDATES


@dataclass(frozen=True, kw_only=True)
class StreamShape:
    """How long this process's share of the stream is, as the work source knows: rows per pass
    (None: unknown), rows per chunk, and the passes the stream runs (None: endless or unknown);
    the mixture's ``components`` (names by component id) and their ``targets`` (weights, by
    the same ids; empty when the work source states none)."""

    rows_per_pass: int | None = None
    chunk_size: int = 1
    passes: int | None = None
    components: tuple[str, ...] = ()
    targets: tuple[float, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Counts:
    """What the items delivered so far hold. ``position``: the rows of the stream read, summed
    over the lanes: each lane's furthest source row delivered (every document of a packed row),
    from the chunk of the lane it is in and its place there (exact while chunks are full).
    ``documents``: the documents delivered per mixture component id (a packed row counts those
    it ends; `zephon_columnar.engine.realized.MixtureCounts`)."""

    items: int = 0
    rows: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    position: int = 0
    documents: tuple[int, ...] = ()


#: Components a readout line shows (a mixture of hundreds: those furthest behind their targets).
SHOWN_COMPONENTS = 8

COUNTS_FIELDS = len(fields(Counts)) - 1  # int64 slots a worker's counts take in `SharedCounts`, and
# one more per mixture component (`documents`)


class Tally:
    """`Counts` of the items one process (or one loader worker) delivered in a pass.

    Example:
        >>> from zephon_columnar.types import SampleBatch
        >>> from zephon_columnar.frame import frame_of
        >>> tally = Tally(chunk_size=4)
        >>> tally.add(SampleBatch(frame_of({"input_ids": [[1, 2, 3], [4]]})))
        Counts(items=1, rows=2, real_tokens=4, padded_tokens=6, position=2, documents=())
    """

    def __init__(self, *, chunk_size: int, components: int = 0) -> None:
        self.chunk_size = chunk_size
        self.counts = Counts(documents=(0,) * components)
        self._reads: dict[int, int] = {}  # lane -> rows it has read (its furthest row delivered)
        self._mixture = MixtureCounts({cid: str(cid) for cid in range(components)})

    def add(self, value: Any) -> Counts:
        """Count one delivered item, a batch or a record; the totals so far."""
        if isinstance(value, SampleRecord):
            meta = value.meta
            payload = value.payload or {}
            name = next((f for f in TOKEN_FIELD_CANDIDATES if f in payload), None)
            tokens = payload[name] if name is not None else ()
            padded = len(tokens) if hasattr(tokens, "__len__") else 0
            self._read(np.array([meta.lane_id]), np.array([meta.chunk_id]), np.array([meta.chunk_offset]))
            self._mixture.delivered_record(meta.component_sample_counts)
            return self._count(rows=1, real=padded - (meta.padding_length or 0), padded=padded)
        table = getattr(value, "table", None)
        if not isinstance(table, pa.Table) or not table.num_rows:
            return self._count(rows=0, real=0, padded=0)
        self._mixture.delivered(table)
        real = padded = 0
        name = next((f for f in TOKEN_FIELD_CANDIDATES if table.schema.get_field_index(f) >= 0), None)
        if name is not None:
            lengths = pc.list_value_length(table.column(name)).to_numpy(zero_copy_only=False)
            real, padded = int(lengths.sum()), table.num_rows * int(lengths.max())
            if table.schema.get_field_index(F.PADDING_LENGTH) >= 0:
                real -= int(pc.sum(table.column(F.PADDING_LENGTH)).as_py() or 0)
        lanes = _numpy(table.column(F.LANE))
        if table.schema.get_field_index(F.SEGMENTS) >= 0:  # a packed row: every document it holds
            segments = table.column(F.SEGMENTS)
            lanes = np.repeat(lanes, pc.list_value_length(segments).to_numpy(zero_copy_only=False))
            documents = pc.list_flatten(segments)
            self._read(lanes, _numpy(pc.struct_field(documents, "chunk")), _numpy(pc.struct_field(documents, "offset")))
        else:
            self._read(lanes, _numpy(table.column(F.CHUNK)), _numpy(table.column(F.OFFSET)))
        return self._count(rows=table.num_rows, real=real, padded=padded)

    def _read(self, lanes: np.ndarray, chunks: np.ndarray, places: np.ndarray) -> None:
        read = chunks.astype(np.int64) * self.chunk_size + places + 1
        for lane in np.unique(lanes).tolist():
            furthest = int(read[lanes == lane].max())
            if furthest > self._reads.get(lane, 0):
                self._reads[lane] = furthest

    def _count(self, *, rows: int, real: int, padded: int) -> Counts:
        c = self.counts
        self.counts = Counts(
            items=c.items + 1,
            rows=c.rows + rows,
            real_tokens=c.real_tokens + real,
            padded_tokens=c.padded_tokens + padded,
            position=sum(self._reads.values()),
            documents=tuple(self._mixture.rows_delivered.tolist()),
        )
        return self.counts


def _numpy(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    arr: np.ndarray = (
        values.to_numpy() if isinstance(values, pa.ChunkedArray) else values.to_numpy(zero_copy_only=False)
    )
    return arr


class Progress:
    """Counts what a pass delivers and reports it now and then (see the module docstring):
    `update` with each item in the process that iterates, or `show` with the sum of the loader
    workers' counts."""

    def __init__(
        self,
        *,
        every_s: float = 10.0,
        file: IO[str] | None = None,
        use_tqdm: bool | None = None,
        stream: StreamShape | None = None,
        targets_now: Callable[[], tuple[float, ...]] | None = None,
    ) -> None:
        self.every_s = every_s
        self.file = file if file is not None else sys.stderr
        self.stream = stream or StreamShape()
        # The target shares so far, by component id, asked at each readout (a mixture that
        # changes during the pass: its counters' targets); else the stream's fixed weights.
        self.targets_now = targets_now
        self.counts = Counts()
        self._tally = Tally(chunk_size=self.stream.chunk_size, components=len(self.stream.components))
        self.lanes: dict[int, tuple[int, int]] = {}  # lane -> (items, chunk of its last row)
        self.start = self.last = time.perf_counter()
        self._first: tuple[float, int] | None = None  # (time, position) when the first item came
        self._ended = False
        self._bar: Any = None
        terminal = getattr(self.file, "isatty", lambda: False)()
        if use_tqdm or (use_tqdm is None and terminal):
            try:
                from tqdm import tqdm

                self._bar = tqdm(unit="item", file=self.file, dynamic_ncols=True)
            except ImportError:
                if use_tqdm:
                    raise

    def update(self, value: Any) -> None:
        """Count one delivered item; report when ``every_s`` has passed."""
        table = getattr(value, "table", None)
        if isinstance(table, pa.Table) and table.num_rows:
            lane, chunk = table.column(F.LANE)[-1].as_py(), table.column(F.CHUNK)[-1].as_py()
            self.lanes[lane] = (self.lanes.get(lane, (0, 0))[0] + 1, chunk)
        self.show(self._tally.add(value))

    def show(self, counts: Counts, *, report: bool = False) -> None:
        """Take ``counts`` as the totals so far; report now (``report``) or when ``every_s``
        has passed since the last report."""
        now = time.perf_counter()
        if self._first is None and counts.items:
            self._first = (now, counts.position)
        if self._bar is not None:
            self._bar.update(counts.items - self.counts.items)
        self.counts = counts
        if report or now - self.last >= self.every_s:
            self.last = now
            self._report()

    def line(self) -> str:
        """The readout: counts, tokens and rates, the pass and its ETA, the lanes."""
        c = self.counts
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        parts = [f"zephon_columnar: {c.items:,} items, {c.rows:,} rows"]
        if c.padded_tokens:
            share = 1 - c.real_tokens / c.padded_tokens
            parts.append(f"{c.real_tokens:,} tokens ({c.padded_tokens:,} padded: {share:.1%} padding)")
            parts.append(f"{c.real_tokens / elapsed:,.0f} tok/s ({c.padded_tokens / elapsed:,.0f} padded)")
        else:
            parts.append("0 tokens")
        where = self._where()
        if where:
            parts.append(where)
        mixture = self._mixture()
        if mixture:
            parts.append(mixture)
        if self.lanes:
            parts.append("lanes " + " ".join(f"{lane}:{n}@chunk{ch}" for lane, (n, ch) in sorted(self.lanes.items())))
        return " | ".join(parts)

    def _where(self) -> str:
        """'pass p[/P]: x% of N rows, ETA h:mm:ss' (to the end of the stream when its passes are
        known, else of this pass); empty when the rows per pass are unknown."""
        per_pass, position, passes = self.stream.rows_per_pass, self.counts.position, self.stream.passes
        if not per_pass or not position:
            return ""
        if passes:  # the position is an estimate; it cannot be past the stream's end
            position = per_pass * passes if self._ended else min(position, per_pass * passes)
        index = (position - 1) // per_pass
        done = position - index * per_pass
        label = f"pass {index + 1}" + (f"/{passes}" if passes else "")
        text = f"{label}: {done / per_pass:.0%} of {per_pass:,} rows"
        end = per_pass * (passes if passes else index + 1)
        if self._first is not None:
            since, first = self._first
            rate = (position - first) / max(time.perf_counter() - since, 1e-9)
            if rate > 0 and end > position:
                text += f", ETA {_duration((end - position) / rate)}" + ("" if passes else " (this pass)")
        return text

    def _mixture(self) -> str:
        """'mixture web 70.2% (target 70%), code 29.8% (target 30%)': each component's share of
        the documents delivered; empty for a single component or before any."""
        documents, names, targets = self.counts.documents, self.stream.components, self.stream.targets
        if self.targets_now is not None:
            targets = self.targets_now() or targets
        total = sum(documents)
        if len(names) < 2 or len(documents) != len(names) or not total:
            return ""
        has_targets = len(targets) == len(names)
        order = list(range(len(names)))
        if len(names) > SHOWN_COMPONENTS and has_targets:  # the furthest behind their targets first
            order.sort(key=lambda cid: documents[cid] / total - targets[cid])
        shown = []
        for cid in order[:SHOWN_COMPONENTS]:
            target = f" (target {targets[cid]:.0%})" if has_targets else ""
            shown.append(f"{names[cid]} {documents[cid] / total:.1%}{target}")
        more = f" and {len(names) - SHOWN_COMPONENTS} more" if len(names) > SHOWN_COMPONENTS else ""
        return "mixture " + ", ".join(shown) + more

    def _report(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(self.line().split(" | ", 1)[1], refresh=True)
        else:
            print(self.line(), file=self.file, flush=True)

    def close(self, *, ended: bool = False) -> None:
        """The final line (the totals of the pass; a stream that ``ended`` is read whole)."""
        self._ended = ended
        self._report()
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class SharedCounts:
    """`Counts` per DataLoader worker in memory the workers share with the trainer process
    (``array``: ``workers * COUNTS_FIELDS`` int64, made before the workers start). Each worker
    writes its own slot (one writer a slot); `total` sums them.

    Example:
        >>> import multiprocessing
        >>> shared = SharedCounts(multiprocessing.Array("q", SharedCounts.slots(2, 2), lock=False), components=2)
        >>> shared.put(0, Counts(items=2, rows=8, position=8, documents=(6, 2)))
        >>> shared.put(1, Counts(items=1, rows=4, position=4, documents=(3, 1)))
        >>> shared.total()
        Counts(items=3, rows=12, real_tokens=0, padded_tokens=0, position=12, documents=(9, 3))
    """

    def __init__(self, array: Any, *, components: int = 0) -> None:
        self.array = array
        self.width = COUNTS_FIELDS + components  # int64 slots per worker

    @staticmethod
    def slots(workers: int, components: int) -> int:
        """The int64 slots ``array`` needs for ``workers`` workers and ``components`` components."""
        return workers * (COUNTS_FIELDS + components)

    def put(self, worker: int, counts: Counts) -> None:
        *scalars, documents = astuple(counts)
        self.array[worker * self.width : (worker + 1) * self.width] = (*scalars, *documents)

    def total(self) -> Counts:
        sums = np.frombuffer(self.array, dtype=np.int64).reshape(-1, self.width).sum(axis=0).tolist()
        scalars = dict(zip((f.name for f in fields(Counts)), sums[:COUNTS_FIELDS]))
        return Counts(**scalars, documents=tuple(sums[COUNTS_FIELDS:]))


def report_shared(fresh: Callable[[], Progress], shared: SharedCounts, alive: Callable[[], bool]) -> threading.Thread:
    """A daemon thread of the trainer process that shows ``shared``'s totals every ``every_s``
    seconds in which they changed (so the last line holds the final totals), on a ``fresh()``
    readout for each pass, until ``alive()`` is False."""
    progress = fresh()

    def run() -> None:
        shown = progress
        while alive():
            time.sleep(max(progress.every_s, 0.05))
            counts = shared.total()
            if counts.items < shown.counts.items:  # the workers began another pass
                shown.close()
                shown = fresh()
            if counts != shown.counts:  # reported at once: this loop paces the lines
                shown.show(counts, report=True)

    thread = threading.Thread(target=run, name="zephon_columnar-progress", daemon=True)
    thread.start()
    return thread
