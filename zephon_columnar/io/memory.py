"""`InMemoryShard`: a shard held in memory, what ``Dataset.from_dict`` takes (tests, quick starts).

Example:
    >>> shard = InMemoryShard([{"text": "hello"}, {"text": "world"}])
    >>> len(shard), shard[1], shard.getsamples([0])
    (2, {'text': 'world'}, [{'text': 'hello'}])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError


class InMemoryShard:
    """A shard held in memory: a list of row dicts (or an Arrow table).

    Example:
        >>> InMemoryShard([{"text": "hello"}]).getsamples([0])
        [{'text': 'hello'}]
    """

    def __init__(self, rows: Sequence[Mapping[str, Any]] | pa.Table) -> None:
        if isinstance(rows, pa.Table):
            self.table = rows
        else:
            rows = list(rows)
            bad = next((i for i, r in enumerate(rows) if not isinstance(r, Mapping)), None)
            if bad is not None:
                raise ConfigError(
                    f"InMemoryShard row {bad} is a {type(rows[bad]).__name__}, not a dict; "
                    "pass a list of {column: value} dicts."
                )
            self.table = pa.Table.from_pylist(rows) if any(rows) else F.no_fields(len(rows))  # [{}, {}]: 2 rows

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"InMemoryShard: row {index} is out of range for a shard of {len(self)} rows.")
        return self.table.slice(index % len(self), 1).to_pylist()[0]

    @property
    def raw_bytes(self) -> int:
        """The payload's content bytes, as Zephon counts them: UTF-8 bytes of strings, bytes of
        binaries, 8 per number, bool or null; lists and structs the sum of their members (no
        keys, no container overhead)."""
        return sum(content_bytes(column) for column in self.table.columns)

    def getsamples(self, indices: Iterable[int]) -> list[dict[str, Any]]:
        positions = [int(i) for i in indices]
        if not self.table.num_columns:  # rows without fields: Arrow's take would return none
            return [self[i] for i in positions]
        return self.table.take(pa.array(positions, pa.int64())).to_pylist()

    def close(self) -> None:
        pass


def content_bytes(values: pa.Array | pa.ChunkedArray) -> int:
    """Content bytes of an Arrow column (see `InMemoryShard.raw_bytes`), computed column-wise.

    Example:
        >>> content_bytes(pa.array(["abcd", None, "é"])), content_bytes(pa.array([[1, 2], None]))
        (14, 24)
    """
    if isinstance(values, pa.ChunkedArray):
        return sum(content_bytes(chunk) for chunk in values.chunks)
    kind = values.type
    nulls = values.null_count * 8
    if pa.types.is_dictionary(kind):
        return content_bytes(values.dictionary_decode())
    if (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    ):
        return int(pc.sum(pc.binary_length(values)).as_py() or 0) + nulls
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return content_bytes(values.flatten()) + nulls
    if pa.types.is_struct(kind):
        return sum(content_bytes(child) for child in values.flatten()) + nulls
    return 8 * len(values)  # numbers, bools, temporals and nulls: 8 each


__all__ = ["InMemoryShard"]
