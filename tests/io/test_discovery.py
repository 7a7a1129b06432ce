"""Format detection, path/URL handling and the errors of `Dataset.from_path`."""

from __future__ import annotations

import gzip
import io
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.extras import require
import zephon_columnar.io as zio
from zephon_columnar.errors import ConfigError, DatasetFormatError, DatasetNotFoundError
from zephon_columnar.io import Dataset, fs


def table(n: int, start: int = 0) -> pa.Table:
    return pa.table({"id": np.arange(start, start + n), "text": [f"t{i}" for i in range(start, start + n)]})


def jsonl_bytes(t: pa.Table) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in t.to_pylist()).encode()


def test_io_exports_zephons_names():
    assert {"Dataset", "InMemoryShard", "ShardInfo"} <= set(zio.__all__)


def test_missing_path_is_named(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=rf"Dataset 'web': {tmp_path}/nope does not exist") as e:
        Dataset.from_path("web", str(tmp_path / "nope"))
    assert isinstance(e.value, FileNotFoundError)
    with pytest.raises(DatasetNotFoundError, match="memory://no/such/dir does not exist"):
        Dataset.from_path("web", "memory://no/such/dir")


def test_unknown_fmt_lists_the_valid_ones(tmp_path):
    names = ["parquet", "jsonl", "hf", "arrow", "webdataset", "lance", "vortex", "mds", "litdata"]
    with pytest.raises(ConfigError, match=re.escape(f"fmt='csv' is not a format; pass one of {names}")):
        Dataset.from_path("web", str(tmp_path), fmt="csv")


def test_a_single_file_is_a_one_shard_dataset(tmp_path):
    pq.write_table(table(30), tmp_path / "only.parquet")
    (tmp_path / "rows.json").write_bytes(jsonl_bytes(table(4)))
    ds = Dataset.from_path("one", str(tmp_path / "only.parquet"))
    assert ds.shard_count() == 1 and ds.total() == 30 and ds.format.name == "parquet"
    assert Dataset.from_path("j", str(tmp_path / "rows.json")).total() == 4  # *.json given directly
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(DatasetFormatError, match=r"cannot tell the format of .*notes\.txt.*pass fmt="):
        Dataset.from_path("t", str(tmp_path / "notes.txt"))


def test_detection_skips_markers_and_metadata_json(tmp_path):
    for s in range(2):
        pq.write_table(table(10, 10 * s), tmp_path / f"part-{s}.parquet")
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / ".part-0.parquet.crc").write_text("")
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "README.md").write_text("# data")
    ds = Dataset.from_path("web", str(tmp_path))
    assert [fs.basename(s.path) for s in ds.shards] == ["part-0.parquet", "part-1.parquet"]
    assert ds.describe() == {"name": "web", "shards": 2, "rows": 20}
    assert ds.format.name == "parquet" and ds.path == str(tmp_path)


def test_a_directory_without_data_lists_what_it_found(tmp_path):
    (tmp_path / "README.md").write_text("x")
    (tmp_path / "rows.json").write_bytes(jsonl_bytes(table(3)))
    with pytest.raises(DatasetFormatError, match=r"holds no data files \(found: README\.md, rows\.json\)\. Expected \*\.parquet, .*fmt='jsonl'"):
        Dataset.from_path("x", str(tmp_path))
    assert Dataset.from_path("x", str(tmp_path), fmt="jsonl").total() == 3
    with pytest.raises(DatasetFormatError, match=r"holds no parquet data \(found: README\.md, rows\.json\); fmt='parquet' reads \*\.parquet"):
        Dataset.from_path("x", str(tmp_path), fmt="parquet")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetFormatError, match=r"found: nothing"):
        Dataset.from_path("x", str(tmp_path / "empty"))


def test_mixed_formats_are_refused_unless_fmt_picks_one(tmp_path):
    pq.write_table(table(10), tmp_path / "a.parquet")
    (tmp_path / "b.jsonl").write_bytes(jsonl_bytes(table(5)))
    with pytest.raises(DatasetFormatError, match=r"mixes formats: 1 parquet \(a\.parquet\); 1 jsonl \(b\.jsonl\).*fmt="):
        Dataset.from_path("m", str(tmp_path))
    assert Dataset.from_path("m", str(tmp_path), fmt="parquet").total() == 10
    assert Dataset.from_path("m", str(tmp_path), fmt="jsonl").total() == 5


def test_fmt_hf_needs_a_save_to_disk_folder(tmp_path):
    pq.write_table(table(10), tmp_path / "a.parquet")
    with pytest.raises(DatasetFormatError, match=r"holds no hf data \(found: a\.parquet\); fmt='hf' reads a datasets save_to_disk folder \(state\.json\)"):
        Dataset.from_path("h", str(tmp_path), fmt="hf")


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_an_empty_dataset_is_refused(tmp_path, kind):
    if kind == "parquet":
        pq.write_table(table(0), tmp_path / "a.parquet")
    else:
        (tmp_path / "a.jsonl").write_text("\n\n")
    with pytest.raises(DatasetFormatError, match=r"Dataset 'void' at .* has 0 rows .*cannot be mixed"):
        Dataset.from_path("void", str(tmp_path))


def test_empty_shards_next_to_full_ones_are_kept(tmp_path):
    (tmp_path / "a.jsonl").write_text("")
    (tmp_path / "b.jsonl").write_bytes(jsonl_bytes(table(3)))
    ds = Dataset.from_path("x", str(tmp_path))
    assert ds.counts().tolist() == [0, 3] and ds.schema.names == ["id", "text"]


def test_file_urls_work_like_paths(tmp_path):
    pq.write_table(table(12), tmp_path / "a.parquet")
    ds = Dataset.from_path("f", f"file://{tmp_path}")
    assert ds.total() == 12 and ds.open_reader().take(0, np.array([11])).column("id").to_pylist() == [11]


def test_memory_url_datasets_are_readable(memfs):
    mem, root = memfs
    full = [table(40, 0), table(25, 40)]
    for s, t in enumerate(full):
        sink = io.BytesIO()
        pq.write_table(t, sink, row_group_size=8)
        mem.pipe(f"{root}/pq/part-{s}.parquet", sink.getvalue())
    mem.pipe(f"{root}/jl/a.jsonl", jsonl_bytes(full[0]))
    mem.pipe(f"{root}/jl/b.jsonl.gz", gzip.compress(jsonl_bytes(full[1])))
    rows = np.array([24, 0, 7, 8, 9])
    for sub in ("pq", "jl"):
        ds = Dataset.from_path(sub, f"{root}/{sub}")
        assert ds.counts().tolist() == [40, 25] and all(s.path.startswith("memory://") for s in ds.shards)
        assert ds.open_reader().take(1, rows).to_pylist() == full[1].take(pa.array(rows)).to_pylist(), sub


def test_memory_url_save_to_disk_folder_is_readable(tmp_path, memfs):
    mem, root = memfs
    datasets = require("datasets", "hf")
    hf = datasets.Dataset.from_dict({"text": [f"d{i}" for i in range(30)]})
    hf.save_to_disk(str(tmp_path / "hf"), num_shards=2)
    mem.put(str(tmp_path / "hf"), f"{root}/hf", recursive=True)
    ds = Dataset.from_path("hf", f"{root}/hf")
    assert ds.format.name == "hf" and ds.total() == 30
    reader = ds.open_reader()
    got = [r["text"] for s in range(2) for r in reader.take(s, np.arange(ds.shards[s].num_rows)).to_pylist()]
    assert got == hf["text"]


def test_the_reader_comes_from_the_format_and_a_bare_descriptor_cannot_be_read(tmp_path):
    mem_ds = Dataset.from_tables("t", [table(5)])
    assert mem_ds.open_reader(columns=["text"]).take(0, np.array([1])).to_pylist() == [{"text": "t1"}]
    with pytest.raises(ConfigError, match=r"no column\(s\) \['nope'\]"):
        mem_ds.open_reader(columns=["nope"])
    bogus = Dataset(name="b", backend={"kind": "vortex"}, path=None, shards=())  # Zephon's descriptor form
    with pytest.raises(ConfigError, match=r"Dataset 'b' is a descriptor \(\{'kind': 'vortex'\}\) with no format"):
        bogus.open_reader()


def test_an_unreadable_directory_is_a_permission_error_naming_dataset_and_path(tmp_path, deny_read):
    d = tmp_path / "web"
    d.mkdir()
    pq.write_table(table(3), d / "a.parquet")
    deny_read(d)
    with pytest.raises(PermissionError, match=rf"^Dataset 'web': cannot list the directory {re.escape(str(d))} "
                                              r"\(Permission denied\)\. Give this process read and execute") as e:
        Dataset.from_path("web", str(d))
    assert isinstance(e.value.__cause__, PermissionError)


def write_parts(folder, sizes, start=0):
    folder.mkdir(parents=True, exist_ok=True)
    for s, n in enumerate(sizes):
        pq.write_table(table(n, start), folder / f"part-{s}.parquet")
        start += n
    return start


def ids(ds) -> list[int]:
    reader = ds.open_reader()
    return [i for s, n in enumerate(ds.counts().tolist()) for i in reader.take(s, np.arange(n)).column("id").to_pylist()]


def test_a_list_of_files_is_one_shard_each_in_the_given_order(tmp_path):
    write_parts(tmp_path, [3, 4])
    ds = Dataset.from_path("l", [tmp_path / "part-1.parquet", str(tmp_path / "part-0.parquet")])
    assert ds.counts().tolist() == [4, 3] and ids(ds) == [3, 4, 5, 6, 0, 1, 2]
    with pytest.raises(DatasetNotFoundError, match=r"Dataset 'l': .*part-9\.parquet does not exist"):
        Dataset.from_path("l", [tmp_path / "part-0.parquet", tmp_path / "part-9.parquet"])
    with pytest.raises(DatasetFormatError, match=r"is a folder; a list or glob takes files"):
        Dataset.from_path("l", [tmp_path])
    with pytest.raises(DatasetNotFoundError, match=r"the list of files is empty"):
        Dataset.from_path("l", [])


def test_a_list_mixing_formats_is_refused_naming_them(tmp_path):
    write_parts(tmp_path, [3])
    (tmp_path / "b.jsonl").write_bytes(jsonl_bytes(table(2)))
    with pytest.raises(DatasetFormatError, match=r"the files mix formats: 1 parquet \(part-0\.parquet\); 1 jsonl \(b\.jsonl\)"):
        Dataset.from_path("m", [tmp_path / "part-0.parquet", tmp_path / "b.jsonl"])


def test_a_glob_takes_the_matching_files_sorted_and_names_a_pattern_matching_nothing(tmp_path):
    write_parts(tmp_path / "x", [2, 3])
    write_parts(tmp_path / "y", [4], start=100)
    ds = Dataset.from_path("g", str(tmp_path / "*" / "*.parquet"))
    assert ds.counts().tolist() == [2, 3, 4] and ids(ds)[-1] == 103
    assert Dataset.from_path("g", str(tmp_path / "**" / "part-1.parquet")).counts().tolist() == [3]
    with pytest.raises(DatasetNotFoundError, match=r"Dataset 'g': no file matches .*\*\.jsonl\. Check the pattern"):
        Dataset.from_path("g", str(tmp_path / "*.jsonl"))


def test_a_glob_over_a_memory_url(memfs):
    mem, root = memfs
    for s in range(3):
        sink = io.BytesIO()
        pq.write_table(table(5, s * 5), sink)
        mem.pipe(f"{root}/globbed/part-{s}.parquet", sink.getvalue())
    ds = Dataset.from_path("m", f"{root}/globbed/part-[01].parquet")
    assert ds.counts().tolist() == [5, 5] and ids(ds) == list(range(10))


def test_a_hive_partitioned_folder_is_read_whole_in_path_order(tmp_path):
    end = write_parts(tmp_path / "year=2023" / "month=12", [2])
    end = write_parts(tmp_path / "year=2024" / "month=01", [3, 1], start=end)
    write_parts(tmp_path / "year=2024" / "month=02", [4], start=end)
    (tmp_path / "year=2024" / "_SUCCESS").write_text("")
    ds = Dataset.from_path("p", tmp_path)
    assert ds.counts().tolist() == [2, 3, 1, 4] and ids(ds) == list(range(10))


def test_data_one_level_down_is_named_in_the_error(tmp_path):
    write_parts(tmp_path / "train", [3, 3])
    write_parts(tmp_path / "test", [2])
    (tmp_path / "README.md").write_text("splits")
    with pytest.raises(DatasetFormatError, match=r"holds no data files itself; its folders do: test \(1 parquet\), "
                                                 r"train \(2 parquet\)\. Pass one of those folders"):
        Dataset.from_path("d", tmp_path)
