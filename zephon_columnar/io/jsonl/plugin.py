"""The JSON Lines format plug-in: :class:`JsonlFormat` and its instance `JSONL`.

Contract (the package docstring has the format's rules): discovery counts each file's rows from
its cached line index, widens the files' schemas into the dataset's in shard order (a conflict
across files names the line), and checks the first `SCHEMA_SAMPLE_ROWS` rows of the first
non-empty file strictly; ``open_reader`` gives a :class:`~zephon_columnar.io.jsonl.reader.JsonlReader`.
`zephon_columnar.io.registry` registers `JSONL` with the built-in formats.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from zephon_columnar.errors import DatasetFormatError
from zephon_columnar.io import fs
from zephon_columnar.io.base import BadRecordPolicy, ShardInfo, ShardReader, SkippedRecords
from zephon_columnar.io.format import Discovered, FileFormat
from zephon_columnar.io.jsonl.bad_lines import _check_objects, _check_utf8, _raise_bad_line
from zephon_columnar.io.jsonl.compression import _open_decompressed, _read_exactly, compression_of, is_jsonl_name
from zephon_columnar.io.jsonl.index import LineIndex, _scan_file
from zephon_columnar.io.jsonl.index_cache import line_index
from zephon_columnar.io.jsonl.lines import _terminated
from zephon_columnar.io.jsonl.reader import JsonlReader
from zephon_columnar.io.jsonl.schema import _ONE_TYPE_PER_FIELD, _merge_schemas, _TypeConflict

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11; annotations only

    from zephon_columnar.io.dataset import Dataset


SCHEMA_SAMPLE_ROWS = 1000


@dataclass(frozen=True)
class JsonlFormat(FileFormat):
    """JSON Lines files, one shard each (the module docstring has the rules).

    Example:
        >>> found = JSONL.discover("chat", ["data/chat/part-000.jsonl", "data/chat/part-001.jsonl"])
        >>> [s.num_rows for s in found.shards], JSONL.recognises_file("rows.json", chosen=False)
        ([4, 4], False)
    """

    name: ClassVar[str] = "jsonl"
    expected: ClassVar[str] = "*.jsonl[.gz|.zst]"
    #: "skip": the lines the index found bad (`LineIndex.bad_rows`) are not rows of the dataset.
    on_bad_record: BadRecordPolicy = "raise"

    def with_bad_record_policy(self, policy: BadRecordPolicy, *, dataset: str) -> Self:
        return replace(self, on_bad_record=policy)

    def recognises_file(self, file_name: str, *, chosen: bool) -> bool:
        # In a folder *.json is usually metadata (manifest.json); it counts when asked for.
        return is_jsonl_name(file_name, plain_json=chosen)

    def discover(self, name: str, files: Sequence[str]) -> Discovered:
        """Counts rows from each file's (cached) line index; the schema is the widening of the
        schemas of every file (each inferred from all its lines when it was indexed), in shard
        order. Checks the first ~1000 rows of the first non-empty file strictly. Remote files
        are downloaded once into the shard cache (counting lines needs every byte; the reader
        needs the copy anyway)."""
        files = list(files)

        skip = self.on_bad_record == "skip"

        def one(url: str) -> tuple[LineIndex, ShardInfo]:
            size, version = fs.file_info(url)
            local = fs.default_shard_cache().ensure_local(url, size)
            index = line_index(url, local, size, version)
            extra: dict[str, Any] = {"compression": compression_of(url), "size": size, "version": version}
            rows = index.num_rows
            if skip and len(index.bad_rows):
                rows -= len(index.bad_rows)
                first = tuple(f"{url}:{reason.removeprefix('line ')}" for reason in index.bad_reasons)
                extra["skipped"] = SkippedRecords(count=len(index.bad_rows), first=first)
            return index, ShardInfo(shard_id=0, path=url, num_rows=rows, num_bytes=size, extra=extra)

        if len(files) > 1:
            with ThreadPoolExecutor(max_workers=min(8, len(files))) as pool:
                found = list(pool.map(one, files))
        else:
            found = [one(f) for f in files]
        shards = tuple(
            ShardInfo(shard_id=i, path=info.path, num_rows=info.num_rows, num_bytes=info.num_bytes, extra=info.extra)
            for i, (_, info) in enumerate(found)
        )
        first = next((i for i, s in enumerate(shards) if s.num_rows > 0), None)
        if first is not None and not skip:
            _check_sample(files[first], found[first][0], shards[first].num_bytes)
        schema = _dataset_schema([(info, index) for index, info in found])
        return Discovered(format=self, shards=shards, schema=schema)

    def open_reader(self, dataset: Dataset, *, columns: Sequence[str] | None = None) -> ShardReader:
        return JsonlReader(dataset, columns=columns, skip_bad_records=self.on_bad_record == "skip")


JSONL = JsonlFormat()


def _dataset_schema(files: Sequence[tuple[ShardInfo, LineIndex]]) -> pa.Schema:
    """The schemas of ``files`` widened into one, in order; a field whose types conflict across
    files raises DatasetFormatError naming the first line of the later file that conflicts."""
    schema = pa.schema([])
    for info, index in files:
        try:
            schema = _merge_schemas(schema, index.schema)
        except _TypeConflict as conflict:
            # Only the file's widened schema is cached, not where each type came from: scan it
            # again with the earlier files' types as the seed, which names the line.
            url = info.file_path()
            local = fs.default_shard_cache().ensure_local(url, info.extra.get("size", info.num_bytes))
            _scan_file(url, local, seed=schema)
            raise DatasetFormatError(
                f"{info.path}: field {conflict.path!r} is {conflict.new} in this file but {conflict.old} "
                f"in the files before it. {_ONE_TYPE_PER_FIELD}"
            ) from None
    return schema


def _check_sample(url: str, index: LineIndex, size: int) -> None:
    """Raise DatasetFormatError naming the line unless each of the first ``SCHEMA_SAMPLE_ROWS``
    rows of ``url`` is one JSON object in UTF-8 (also when its index came from the cache: a
    broken file then fails discovery, not the first read of its first rows)."""
    k = min(SCHEMA_SAMPLE_ROWS, index.num_rows)
    local = fs.default_shard_cache().ensure_local(url, size)
    end = int(index.offsets[k])
    try:
        with _open_decompressed(local, compression_of(url)) as stream:
            sample = _read_exactly(stream, end)
    except OSError as err:  # the index came from the cache: this is the first read of the file
        if fs.is_read_failure(err):
            raise fs.unreadable_file(url, err) from err
        raise
    rows = np.arange(k, dtype=np.int64)
    starts = index.offsets[:k]
    ends = index.offsets[1 : k + 1]
    _check_objects(url, index, sample, starts, ends, rows)
    try:
        table = pajson.read_json(
            pa.BufferReader(_terminated(sample)), read_options=pajson.ReadOptions(block_size=max(1 << 20, end + 1))
        )
    except pa.ArrowInvalid as err:
        _raise_bad_line(url, index, sample, starts, ends, rows, None)
        raise DatasetFormatError(
            f"{url}: cannot parse its first {k} rows ({err}). Check the file's encoding (UTF-8) and line endings."
        ) from err
    if table.num_rows != k:  # two values on one line parse as two rows
        _raise_bad_line(url, index, sample, starts, ends, rows, None)
    _check_utf8(url, index, sample, starts, ends, rows, table)
