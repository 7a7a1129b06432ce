"""`InMemoryShard`: a shard held in memory, what ``Dataset.from_dict`` takes (tests, quick starts).

Example:
    >>> shard = InMemoryShard([{"text": "hello"}, {"text": "world"}])
    >>> len(shard), shard[1], shard.getsamples([0])
    (2, {'text': 'world'}, [{'text': 'hello'}])
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa

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
            self.table = pa.Table.from_pylist(rows)

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"InMemoryShard: row {index} is out of range for a shard of {len(self)} rows.")
        return self.table.slice(index % len(self), 1).to_pylist()[0]

    @property
    def raw_bytes(self) -> int:
        return self.table.nbytes

    def getsamples(self, indices: Iterable[int]) -> list[dict[str, Any]]:
        return self.table.take(pa.array(list(indices), pa.int64())).to_pylist()

    def close(self) -> None:
        pass


__all__ = ["InMemoryShard"]
