"""`Dataset`: a named collection of shards with known row counts, held with its format.

A dataset is metadata only (names, paths, row counts, the schema); reading happens through the
:class:`~zephon_columnar.io.base.ShardReader` that :meth:`Dataset.open_reader` returns (its
:class:`~zephon_columnar.io.format.Format` opens it), one per worker. Row counts come from
metadata (Parquet footers, a cached JSONL line index, Arrow IPC batch headers), so discovery
never reads the data twice.

Example:
    >>> ds = Dataset.from_dict("toy", {0: InMemoryShard([{"text": "a"}, {"text": "b"}])})
    >>> len(ds), ds.shard_count(), ds.format.name
    (2, 1, 'inmem')
"""

from __future__ import annotations

import operator
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

import numpy as np
import pyarrow as pa

from zephon_columnar.errors import ConfigError
from zephon_columnar.io.base import SHOWN_SKIPPED, BadRecordPolicy, ShardInfo, ShardReader, SkippedRecords, shard_info
from zephon_columnar.io.discovery import DatasetPath, discover
from zephon_columnar.io.format import Format
from zephon_columnar.io.hf import table_of_hf
from zephon_columnar.io.memory import InMemoryShard as InMemoryShard  # Zephon's place for it
from zephon_columnar.io.memory import InMemoryTables
from zephon_columnar.io.registry import DatasetFormat
from zephon_columnar.io.tables import check_same_schema, in_column_order
from zephon_columnar.keywords import choice, suggest_keywords


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)  # the dataset's metadata: a caller must not edit it through a view
    return array


@dataclass(frozen=True, eq=False)
class Dataset:
    """A named dataset: shards with row counts, their format and their schema.

    ``format`` reads the shards (:meth:`open_reader`); ``schema`` is what its readers return
    (every column, in this order); ``path`` the root it was discovered under (None in memory);
    ``shards`` are sorted by id. Discovered datasets number their shards ``0..n-1`` in sorted
    file-name order; in-memory ones (:meth:`from_dict`, :meth:`from_tables` with ``shard_ids``)
    keep the ids they were given. Readers and :meth:`shard` look shards up by id, and the work
    source's pointers ``(dataset_id, shard_id, row)`` carry these ids.

    ``backend`` is Zephon's descriptor (``{"kind": "parquet", "path": ...}``), kept for code
    that reads it; nothing here does. ``Dataset(name, backend)`` alone, as Zephon allows, is a
    descriptor with no shards and no format: it cannot be read.
    """

    name: str
    backend: Mapping[str, Any] = field(default_factory=dict)
    path: str | None = None
    shards: tuple[ShardInfo, ...] = ()
    format: Format | None = field(default=None, kw_only=True)
    schema: pa.Schema = field(default_factory=lambda: pa.schema([]), kw_only=True)

    # ---------------------------------------------------------------- constructors
    @classmethod
    @suggest_keywords
    def from_path(
        cls,
        name: str,
        path: DatasetPath,
        *,
        fmt: DatasetFormat | str | None = None,
        on_bad_record: BadRecordPolicy = "raise",
    ) -> Dataset:
        """Discover a directory (local path or fsspec URL) of Parquet, JSONL (``.jsonl``,
        ``.jsonl.gz``, ``.jsonl.zst``) or Arrow files (a Hugging Face ``save_to_disk`` folder),
        or of a format registered with `zephon_columnar.io.register_format`; or one file, a
        list of files, a glob (``"data/*.parquet"``), or a Hive-partitioned folder
        (``key=value`` subfolders).

        The format is detected from file suffixes unless ``fmt`` is given
        (`zephon_columnar.io.discovery` has the rules).

        ``on_bad_record``: what to do with a JSON Lines line that is not one JSON object in
        UTF-8: ``"raise"`` (the default) fails when its row is read (or at discovery, in the
        first 1,000 rows), naming the file and line; ``"skip"`` leaves it out of the dataset's
        rows (found when the file is indexed, so every pass, runner and resume reads the same
        rows), counted in `skipped_records` and warned once per pass with the first lines.
        Other formats have no record that can be damaged alone: "skip" is a ConfigError.

        Example:
            >>> Dataset.from_path("web", "data/web")
            Dataset(name='web', format='parquet', path='data/web', shards=2, rows=32)
            >>> Dataset.from_path("wiki", "data/wiki_train")  # a save_to_disk folder
            Dataset(name='wiki', format='hf', path='data/wiki_train', shards=2, rows=16)
            >>> Dataset.from_path("web", ["data/web/part-001.parquet", "data/web/part-000.parquet"]).total()
            32
        """
        _check_name_and_path(name, path)
        choice("Dataset.from_path", "on_bad_record", on_bad_record, get_args(BadRecordPolicy))
        found = discover(name, path, fmt=fmt, on_bad_record=on_bad_record)
        if not isinstance(path, (str, os.PathLike)):
            listed = [os.fspath(p) for p in path]
            path = ", ".join(listed) if len(listed) <= 3 else f"{listed[0]}, ... ({len(listed)} files)"
        path = os.fspath(path)
        return cls(
            name=name,
            backend={"kind": found.format.name, "path": path},
            path=path,
            shards=found.shards,
            format=found.format,
            schema=found.schema,
        )

    @classmethod
    @suggest_keywords
    def from_dict(cls, name: str, shards: Mapping[int, InMemoryShard]) -> Dataset:
        """A dataset of in-memory shards keyed by shard id (an int >= 0).

        The ids are kept: ``ids()`` lists them sorted, readers take rows by them and every
        record's ``meta.sample_id`` is ``(dataset_id, shard_id, row)`` with the id given here.
        A value may be an :class:`InMemoryShard` or what one accepts (row dicts, an Arrow table).
        A negative, non-int or repeated id raises :class:`ConfigError` naming it.

        Example:
            >>> ds = Dataset.from_dict("m", {5: InMemoryShard([{"t": "a"}]), 2: InMemoryShard([{"t": "b"}])})
            >>> ds.ids().tolist(), ds.open_reader().take(5, np.array([0])).column("t").to_pylist()
            ([2, 5], ['a'])
        """
        ids, tables = [], []
        for key in shards:
            ids.append(_check_shard_id(name, key))
            shard = shards[key]
            if not isinstance(shard, InMemoryShard):
                shard = InMemoryShard(shard)
            tables.append(shard.table)
        return cls.from_tables(name, tables, shard_ids=ids)

    @classmethod
    @suggest_keywords
    def from_hf(cls, name: str, hf_dataset: Any) -> Dataset:
        """A one-shard dataset over an in-process ``datasets.Dataset``, zero-copy over its Arrow
        table (`zephon_columnar.io.hf.table_of_hf` says when it is not).

        Example:
            >>> import datasets
            >>> Dataset.from_hf("toy", datasets.Dataset.from_dict({"text": ["a", "b"]})).total()
            2
        """
        return cls.from_tables(name, [table_of_hf(hf_dataset)])

    @classmethod
    @suggest_keywords
    def from_tables(cls, name: str, tables: Sequence[pa.Table], *, shard_ids: Sequence[int] | None = None) -> Dataset:
        """A dataset over in-memory Arrow tables, one shard each.

        ``shard_ids[i]`` is the id of ``tables[i]`` (default ``0..n-1``; ints >= 0, no repeats,
        else :class:`ConfigError`); shards are kept sorted by id. Every table must have the same
        columns and types; the same columns in another order are read in the order of the
        first shard (the one with the lowest id).
        """
        tables = list(tables)
        if shard_ids is None:
            ids = list(range(len(tables)))
        else:
            ids = [_check_shard_id(name, i) for i in shard_ids]
            if len(ids) != len(tables):
                raise ConfigError(
                    f"Dataset {name!r}: {len(ids)} shard ids for {len(tables)} tables; pass one id per table."
                )
            dups = sorted(i for i, c in Counter(ids).items() if c > 1)
            if dups:
                raise ConfigError(f"Dataset {name!r}: duplicate shard ids {dups}; give every shard its own id.")
            order = sorted(range(len(ids)), key=ids.__getitem__)
            ids, tables = [ids[j] for j in order], [tables[j] for j in order]
        check_same_schema(name, [(f"shard {i}", t.schema) for i, t in zip(ids, tables)])
        if tables:
            tables = [in_column_order(t, tables[0].column_names) for t in tables]
        infos = tuple(
            # Stored bytes of an in-memory shard: its content bytes, as Zephon counts them.
            ShardInfo(shard_id=i, path=None, num_rows=t.num_rows, num_bytes=InMemoryShard(t).raw_bytes)
            for i, t in zip(ids, tables)
        )
        memory = InMemoryTables(tuple(tables))
        schema = tables[0].schema if tables else pa.schema([])
        return cls(name=name, backend={"kind": memory.name}, path=None, shards=infos, format=memory, schema=schema)

    # ---------------------------------------------------------------- metadata
    def ids(self) -> np.ndarray:
        """Shard ids, in the order of ``shards`` (sorted); ``counts()[i]`` is shard ``ids()[i]``'s."""
        return _read_only(np.array([s.shard_id for s in self.shards], dtype=np.int64))

    def shard(self, shard_id: int) -> ShardInfo:
        """The :class:`ShardInfo` of the shard with id ``shard_id`` (an IndexError naming the
        ids otherwise)."""
        return shard_info(self.shards, shard_id, dataset=self.name)

    def shard_label(self, shard_id: int) -> str:
        """A shard as an error names it: ``shard <path> (<id>)``, or ``shard <id>`` for a shard
        held in memory or an id the dataset does not have.

        Example:
            >>> Dataset.from_dict("toy", {3: InMemoryShard([{"x": 1}])}).shard_label(3)
            'shard 3'
        """
        path = next((s.path for s in self.shards if s.shard_id == shard_id), None)
        return f"shard {shard_id}" if path is None else f"shard {path} ({shard_id})"

    def counts(self) -> np.ndarray:
        """Rows per shard, in the order of ``ids()`` (read-only)."""
        return _read_only(np.array([s.num_rows for s in self.shards], dtype=np.int64))

    def raw_bytes(self) -> np.ndarray:
        """Stored bytes per shard (file sizes; content bytes in memory), in the order of ``ids()``
        (read-only)."""
        return _read_only(np.array([s.num_bytes for s in self.shards], dtype=np.int64))

    def total(self) -> int:
        return int(sum(s.num_rows for s in self.shards))

    def skipped_records(self) -> SkippedRecords:
        """The records discovery left out of the rows under ``on_bad_record="skip"``, over every
        shard, with the first few locations.

        Example:
            >>> Dataset.from_path("chat", "data/chat", on_bad_record="skip").skipped_records().count
            0
        """
        found = [s.extra["skipped"] for s in self.shards if "skipped" in s.extra]
        first = tuple(where for f in found for where in f.first)[:SHOWN_SKIPPED]
        return SkippedRecords(count=sum(f.count for f in found), first=first)

    def __len__(self) -> int:
        return self.total()

    def max_count(self) -> int:
        return max((s.num_rows for s in self.shards), default=0)

    def shard_count(self) -> int:
        return len(self.shards)

    def describe(self) -> dict[str, Any]:
        """JSON-friendly identity of the dataset (compared when a checkpoint is restored).

        The location is left out on purpose: the same shards moved to another directory or
        bucket (or reached through another relative path) resume the same data order."""
        return {"name": self.name, "shards": len(self.shards), "rows": self.total()}

    # ---------------------------------------------------------------- reading
    def open_reader(self, *, columns: Sequence[str] | None = None) -> ShardReader:
        """A fresh reader of this dataset's shards, one per worker (not thread-safe), restricted
        to ``columns`` (None: all; an unknown name is a ConfigError listing the dataset's).

        Every reader takes ``shard_id`` as the dataset's shard id (``ids()``), never as a
        position.

        Example:
            >>> Dataset.from_path("web", "data/web").open_reader(columns=["id"]).take(1, np.arange(3))
            pyarrow.Table
            id: int64
            ----
            id: [[16,17,18]]
        """
        if self.format is None:
            raise ConfigError(
                f"Dataset {self.name!r} is a descriptor ({dict(self.backend)!r}) with no format, so nothing "
                "can read it. Build datasets with Dataset.from_path / from_hf / from_dict / from_tables."
            )
        return self.format.open_reader(self, columns=columns)

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, format={self.format_name!r}, path={self.path!r}, "
            f"shards={len(self.shards)}, rows={self.total()})"
        )

    @property
    def format_name(self) -> str | None:
        """The format's name (``"parquet"``, ``"jsonl"``, ``"inmem"``...); None without one."""
        return None if self.format is None else self.format.name


def _check_name_and_path(name: Any, path: Any) -> None:
    """``from_path``'s arguments, checked at the call: ``name`` a non-empty str (the mixture's
    key), ``path`` a str, an ``os.PathLike`` or a list of them. A TypeError (a ConfigError for
    an empty name) naming the argument otherwise.

    Example:
        >>> _check_name_and_path("web", 42)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: Dataset.from_path('web', path=42): path is not a path but an int; pass a folder, ...
    """
    if not isinstance(name, str):
        raise TypeError(
            f"Dataset.from_path(name={name!r}): name is not a str but {_a(name)}; pass the dataset's name in the "
            'mixture, e.g. Dataset.from_path("web", "data/web").'
        )
    if not name:
        raise ConfigError(
            "Dataset.from_path(name=''): the name is empty; pass the dataset's name in the mixture, e.g. "
            'Dataset.from_path("web", "data/web").'
        )
    what = "a folder, file, glob or URL as a str (or os.PathLike), or a list of them"
    if isinstance(path, (str, os.PathLike)):
        return
    if isinstance(path, (bytes, bytearray)) or not isinstance(path, Sequence):
        raise TypeError(f"Dataset.from_path({name!r}, path={path!r}): path is not a path but {_a(path)}; pass {what}.")
    for k, item in enumerate(path):
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(
                f"Dataset.from_path({name!r}, path=[...]): path[{k}]={item!r} is not a path but {_a(item)}; "
                f"pass {what}."
            )


def _a(value: Any) -> str:
    """``value``'s type name with its article: "an int", "a list"."""
    kind = type(value).__name__
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"


def _check_shard_id(name: str, shard_id: Any) -> int:
    """``shard_id`` as an int >= 0; a ConfigError naming it otherwise."""
    try:
        if isinstance(shard_id, (bool, np.bool_)):
            raise TypeError
        value = operator.index(shard_id)
    except TypeError:
        raise ConfigError(
            f"Dataset {name!r}: shard id {shard_id!r} is not an int; key the shards by "
            "int ids >= 0, e.g. {0: InMemoryShard(rows)}."
        ) from None
    if value < 0:
        raise ConfigError(f"Dataset {name!r}: shard id {value} is negative; shard ids are ints >= 0.")
    return value
