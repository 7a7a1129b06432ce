"""The `Format` plug-in: the built-in formats through the interface, and a format of one's own
(CSV, written by pyarrow's own CSV writer) added in this module alone, found by discovery,
read by every runner and resumed exactly."""

from __future__ import annotations

import json
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, get_args

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from tests.extras import require
from tests.format_writers import litdata, streaming
from zephon_columnar import Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import ConfigError
from zephon_columnar.io import Dataset, fs
from zephon_columnar.io import registry as registry_module
from zephon_columnar.io.base import ShardInfo, ShardReader, check_columns
from zephon_columnar.io.format import Discovered, FileFormat
from zephon_columnar.io.memory import TableReader
from zephon_columnar.io.registry import BUILT_IN, DatasetFormat, format_named, formats, register_format
from zephon_columnar.io.tables import check_same_schema


@dataclass(frozen=True)
class CsvFormat(FileFormat):
    """A small format of one's own: every ``*.csv`` file is a shard, read whole by pyarrow."""

    name: ClassVar[str] = "csv"
    expected: ClassVar[str] = "*.csv"

    def recognises_file(self, file_name: str, *, chosen: bool) -> bool:
        return file_name.endswith(".csv")

    def discover(self, name: str, files: Sequence[str]) -> Discovered:
        tables = [pacsv.read_csv(f) for f in files]
        check_same_schema(name, [(f"shard {i}", t.schema) for i, t in enumerate(tables)])
        shards = tuple(
            ShardInfo(shard_id=i, path=f, num_rows=t.num_rows, num_bytes=fs.file_size(f))
            for i, (f, t) in enumerate(zip(files, tables))
        )
        return Discovered(format=self, shards=shards, schema=tables[0].schema)

    def open_reader(self, dataset: Dataset, *, columns: Sequence[str] | None = None) -> ShardReader:
        names = check_columns(dataset.name, dataset.schema, columns)
        tables = [pacsv.read_csv(s.file_path()) for s in dataset.shards]
        if names is not None:
            tables = [t.select(names) for t in tables]
        return TableReader(tables, [s.shard_id for s in dataset.shards], dataset=dataset.name)


@dataclass(frozen=True)
class OtherCsv(CsvFormat):
    """Another class under the name "csv"."""


@pytest.fixture
def csv_registered(monkeypatch):
    monkeypatch.setattr(registry_module, "_registered", [])
    register_format(CsvFormat())
    return CsvFormat()


def write_csv(root, shards: int = 3, rows: int = 20, first: int = 0) -> None:
    root.mkdir(exist_ok=True)
    for s in range(shards):
        ids = np.arange(first + s * rows, first + (s + 1) * rows)
        pacsv.write_csv(pa.table({"id": ids, "text": [f"row {i}" for i in ids]}), root / f"part-{s}.csv")


def test_the_type_hint_lists_exactly_the_built_in_formats():
    assert list(get_args(DatasetFormat)) == [f.name for f in BUILT_IN]
    assert len({f.name for f in BUILT_IN}) == len(BUILT_IN)
    assert all(f.expected for f in BUILT_IN)


def write_dataset(fmt: str, root) -> str:
    """Ten rows in format ``fmt`` under ``root``, written by the format's own library."""
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    table = pa.table({"id": np.arange(10), "text": [f"t{i}" for i in range(10)]})
    if fmt == "hf":
        require("datasets", "hf").Dataset.from_dict(table.to_pydict()).save_to_disk(str(root))
        return str(root)
    if fmt == "mds":
        with streaming().MDSWriter(out=str(root), columns={"id": "int", "text": "str"}) as sink:
            for row in table.to_pylist():
                sink.write(row)
        return str(root)
    if fmt == "litdata":
        writer = litdata().streaming.writer.BinaryWriter(str(root), chunk_size=4)
        for i, row in enumerate(table.to_pylist()):
            writer.add_item(i, row)
        writer.done()
        writer.merge()
        return str(root)
    if fmt == "lance":
        require("lance", "lance").write_dataset(table, str(root))
        return str(root)
    root.mkdir()
    if fmt == "parquet":
        pq.write_table(table, root / "a.parquet")
    elif fmt == "jsonl":
        (root / "a.jsonl").write_text("".join(json.dumps(row) + "\n" for row in table.to_pylist()))
    elif fmt == "webdataset":
        with require("webdataset", "formats").TarWriter(str(root / "a.tar")) as sink:
            for row in table.to_pylist():
                sink.write({"__key__": f"k{row['id']:03d}", "id": str(row["id"]).encode(), "text": row["text"].encode()})
    elif fmt == "vortex":
        require("vortex", "vortex").io.write(table, str(root / "a.vortex"))
    else:
        feather.write_feather(table, root / "a.arrow")
    return str(root)


@pytest.mark.parametrize("fmt", [f.name for f in BUILT_IN])
def test_every_built_in_format_discovers_reads_and_pickles_with_its_dataset(fmt, tmp_path):
    path = write_dataset(fmt, tmp_path / fmt)
    ds = Dataset.from_path(fmt, path)
    assert ds.format == format_named(fmt, where="test") and ds.format_name == fmt
    assert ds.backend == {"kind": fmt, "path": path}
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.format == ds.format and copy.schema == ds.schema
    first = ds.shards[0]
    rows = np.arange(first.num_rows)
    assert copy.open_reader().take(first.shard_id, rows).equals(ds.open_reader().take(first.shard_id, rows))
    assert copy.open_reader(columns=["id"]).take(first.shard_id, rows[:2]).column_names == ["id"]


def test_a_registered_format_is_detected_and_named_like_a_built_in_one(tmp_path, csv_registered):
    write_csv(tmp_path / "c")
    ds = Dataset.from_path("c", str(tmp_path / "c"))
    assert ds.format == csv_registered and ds.counts().tolist() == [20, 20, 20]
    assert Dataset.from_path("c", str(tmp_path / "c"), fmt="csv").total() == 60
    one_file = Dataset.from_path("c", str(tmp_path / "c" / "part-1.csv"))
    assert one_file.open_reader().take(0, np.array([0])).to_pylist() == [{"id": 20, "text": "row 20"}]
    assert [f.name for f in formats()][-1] == "csv"


def test_registering_is_idempotent_and_a_taken_name_is_refused(csv_registered):
    register_format(CsvFormat())
    assert [f.name for f in formats()].count("csv") == 1
    with pytest.raises(ConfigError, match=r"the name 'csv' is taken by CsvFormat; give OtherCsv another name"):
        register_format(OtherCsv())
    with pytest.raises(ConfigError, match=r"expected a FileFormat instance, got str"):
        register_format("csv")  # type: ignore[arg-type]


def test_without_registration_the_format_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(registry_module, "_registered", [])
    write_csv(tmp_path / "c")
    known = r"\['parquet', 'jsonl', 'hf', 'arrow', 'webdataset', 'lance', 'vortex', 'mds', 'litdata'\]"
    with pytest.raises(ConfigError, match=rf"fmt='csv' is not a format; pass one of {known} or None"):
        Dataset.from_path("c", str(tmp_path / "c"), fmt="csv")


@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_a_format_of_ones_own_runs_and_resumes_exactly_on_every_runner(tmp_path, csv_registered, runner):
    write_csv(tmp_path / "c", shards=4, rows=25)
    write_csv(tmp_path / "d", shards=2, rows=15, first=1000)

    def build() -> Pipeline:
        c, d = Dataset.from_path("c", str(tmp_path / "c")), Dataset.from_path("d", str(tmp_path / "d"))
        ws = StaticMixtureWorkSource([c, d], {"c": 0.7, "d": 0.3}, chunk_size=8, seed=5)
        pipe = Pipeline(ws).shuffle(buffer_size=16, seed=2).batch(6, drop_last=False)
        return pipe.options(runner=runner, max_workers=2)

    def ids(batches) -> list[int]:
        return [i for b in batches for i in b.to_pydict()["id"]]

    whole = ids(build())
    # Every row of the larger dataset once; the smaller one repeats to hold its share of the mixture.
    assert sorted(i for i in whole if i < 1000) == list(range(100))
    assert set(whole) - set(range(100)) == set(range(1000, 1030))
    pipe = build()
    it = iter(pipe)
    head = [next(it) for _ in range(7)]
    state = pipe.checkpoint()
    it.close()
    resumed = build()
    resumed.restore(state)
    assert ids(head) + ids(resumed) == whole
