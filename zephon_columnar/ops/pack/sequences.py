"""``pack_sequences`` output: packed rows that keep their segments apart.

Each packed row is ``{"packed_samples": [segment, ...]}`` (bookkeeping as for ``pack_flat``:
the first segment's sample, ``__segments``), in the same rows the algorithm makes, unpadded:

- ``first_fit`` / ``best_fit``: each segment is its whole document's payload (every field);
- ``wrap`` / ``best_fit_wrap``: each segment is a slice of the document: its token column and
  aligned fields (see `zephon_columnar.ops.pack.stream`), cut where the row cuts it.

``pack_payloads`` merges the list: ``"keep_list"`` (default) keeps it; ``"numpy_array"`` /
``"torch_tensor"`` give ``{field: one array}`` per row, the concatenation of the segments
(record views hold numpy arrays / torch tensors; every field must be a list of numbers); a
callable ``fn(segments) -> value`` is applied to the list (the value must be Arrow-storable:
numbers, strings, lists, dicts, numpy arrays).

Example:
    >>> from zephon_columnar.frame import frame_of
    >>> from zephon_columnar.ops.pack import PackSequencesOp
    >>> acc = PackSequencesOp(6, algorithm="first_fit", num_bins=1).lane_accumulator()
    >>> out = acc.push(frame_of({"input_ids": [[1, 2, 3], [4, 5], [6, 7, 8]], "tag": ["a", "b", "c"]}))
    >>> out[0].column("packed_samples").to_pylist()
    [[{'input_ids': [1, 2, 3], 'tag': 'a'}, {'input_ids': [4, 5], 'tag': 'b'}]]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError, WrongTypeError
from zephon_columnar.ops.pack.emit import pieces, segments_column
from zephon_columnar.ops.pack.spec import FIT_ALGORITHMS, PackSpec
from zephon_columnar.ops.pack.stream import TokenRun

PACKED = "packed_samples"
MERGES = ("keep_list", "numpy_array", "torch_tensor")
#: Field metadata that tells record views to hold a merged field as numpy arrays / torch tensors.
MERGE_KEY = b"zephon_columnar.pack_payloads"
#: Field metadata naming the packed (token and aligned) columns, for restores.
PACKED_COLUMNS_KEY = b"zephon_columnar.packed_columns"


def check_pack_payloads(value: Any) -> Any:
    if callable(value) or value in MERGES:
        return value
    raise ConfigError(
        f"pack_sequences(pack_payloads={value!r}): use one of {list(MERGES)} or a callable list -> value."
    )


class SequencesEmitter:
    """Runs and row lengths -> ``packed_samples`` rows (see the module docstring)."""

    def __init__(self, spec: PackSpec, pack_payloads: Any) -> None:
        self.spec = spec
        self.merge = pack_payloads
        self.whole = spec.algorithm in FIT_ALGORITHMS

    def __call__(self, run: TokenRun, row_lengths: np.ndarray) -> pa.Table:
        row_lengths = row_lengths.astype(np.int64, copy=False)
        ends = np.cumsum(row_lengths)
        total = int(ends[-1])
        row_starts = ends - row_lengths
        first = run.book.take(pa.array(run.seg_book[run.segment_at(row_starts)]))
        cols = [first.column(n) for n in first.column_names if F.is_bookkeeping(n)]
        names = [n for n in first.column_names if F.is_bookkeeping(n)]
        cols.append(segments_column(run, row_starts, total))
        names.append(F.SEGMENTS)
        if self.merge in ("numpy_array", "torch_tensor"):
            cols.append(self._merged(run, row_starts, row_lengths))
        else:
            cols.append(self._lists(run, row_starts, total))
        names.append(PACKED)
        table = pa.Table.from_arrays(cols, names=names)
        meta = {PACKED_COLUMNS_KEY: ",".join(run.data).encode()}
        if self.merge in ("numpy_array", "torch_tensor"):
            meta[MERGE_KEY] = self.merge.encode()
        field = table.schema.field(PACKED).with_metadata(meta)
        return table.cast(table.schema.set(table.schema.get_field_index(PACKED), field))

    def _lists(self, run: TokenRun, row_starts: np.ndarray, total: int) -> pa.Array:
        starts, lengths, seg, row = pieces(run, row_starts, total)
        fields: list[pa.Array] = []
        names: list[str] = []
        piece_offsets = pa.array(
            np.append(starts, starts[-1] + lengths[-1]).astype(np.int32) if len(starts) else np.zeros(1, np.int32)
        )
        for name, values in run.data.items():
            fields.append(pa.ListArray.from_arrays(piece_offsets, pa.array(values[:total])))
            names.append(name)
        if self.whole:  # whole documents: every other field of their payload too
            book = run.book.take(pa.array(run.seg_book[seg]))
            for name in F.payload_names(book):
                fields.append(book.column(name).combine_chunks())
                names.append(name)
        struct = pa.StructArray.from_arrays(fields, names=names)
        counts = np.bincount(row, minlength=len(row_starts))
        offsets = np.zeros(len(row_starts) + 1, np.int32)
        np.cumsum(counts, out=offsets[1:])
        return pa.ListArray.from_arrays(pa.array(offsets), struct)

    def _merged(self, run: TokenRun, row_starts: np.ndarray, row_lengths: np.ndarray) -> pa.Array:
        if self.whole:
            other = [n for n in F.payload_names(run.book)]
            if other:
                raise WrongTypeError(
                    f"pack_sequences(pack_payloads={self.merge!r}): field(s) {other} are not lists "
                    "of numbers aligned with the tokens, so they cannot be concatenated; drop them "
                    "first or use pack_payloads='keep_list'."
                )
        offsets = pa.array(np.append(row_starts, row_starts[-1] + row_lengths[-1]).astype(np.int32))
        total = int(row_starts[-1] + row_lengths[-1])
        return pa.StructArray.from_arrays(
            [pa.ListArray.from_arrays(offsets, pa.array(v[:total])) for v in run.data.values()], names=list(run.data)
        )


def merge_with(fn: Callable[[list[dict[str, Any]]], Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The payload function that applies a ``pack_payloads`` callable to ``packed_samples``."""

    def apply(payload: dict[str, Any]) -> dict[str, Any]:
        out = fn(payload[PACKED])
        if isinstance(out, np.ndarray):
            out = out.tolist()
        return {**payload, PACKED: out}

    apply.__qualname__ = f"pack_payloads({getattr(fn, '__qualname__', 'fn')})"
    return apply
