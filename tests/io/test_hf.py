"""Hugging Face datasets (save_to_disk folders and in-process objects) and plain Arrow IPC files."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pytest

from tests.extras import require
from zephon_columnar.errors import ConfigError, DatasetFormatError
from zephon_columnar.io import Dataset
from zephon_columnar.io.hf import ArrowReader

datasets = require("datasets", "hf")
datasets.disable_progress_bars()


def hf_rows(n: int) -> dict:
    return {"text": [f"doc {i}" for i in range(n)], "n": list(range(n)), "ids": [[i] * (i % 4) for i in range(n)]}


@pytest.fixture(scope="module")
def hf_ds() -> datasets.Dataset:
    return datasets.Dataset.from_dict(hf_rows(500))


def test_save_to_disk_folder_reads_the_same_rows(tmp_path, hf_ds):
    folder = tmp_path / "train"
    hf_ds.save_to_disk(str(folder), num_shards=3)
    ds = Dataset.from_path("wiki", str(folder))
    assert ds.format.name == "hf" and ds.shard_count() == 3 and ds.total() == 500
    # Shards in state.json order; their concatenation is the HF dataset.
    reader = ds.open_reader()
    got = [r for s in range(3) for r in reader.take(s, np.arange(ds.shards[s].num_rows)).to_pylist()]
    assert got == hf_ds.to_list()
    rng = np.random.default_rng(0)
    rows = rng.integers(0, ds.shards[1].num_rows, 50)
    offset = ds.shards[0].num_rows
    assert reader.take(1, rows).to_pylist() == [hf_ds[int(offset + r)] for r in rows]


def test_save_to_disk_of_a_shuffled_dataset_keeps_its_order(tmp_path, hf_ds):
    shuffled = hf_ds.shuffle(seed=3)
    shuffled.save_to_disk(str(tmp_path / "s"))
    ds = Dataset.from_path("s", str(tmp_path / "s"), fmt="hf")
    assert ds.open_reader().take(0, np.arange(500)).to_pylist() == shuffled.to_list()


def test_consecutive_rows_of_a_mapped_shard_are_zero_copy(tmp_path, hf_ds):
    hf_ds.save_to_disk(str(tmp_path / "t"))
    reader = ArrowReader(Dataset.from_path("t", str(tmp_path / "t")))
    a = reader.take(0, np.arange(10, 20)).column("n").chunk(0)
    b = reader.take(0, np.arange(15, 18)).column("n").chunk(0)
    assert a.buffers()[1].address == b.buffers()[1].address and b.offset == a.offset + 5


def test_dataset_dict_folder_says_to_pick_a_split(tmp_path, hf_ds):
    datasets.DatasetDict({"train": hf_ds, "test": hf_ds.select(range(5))}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ConfigError, match=r"DatasetDict folder \(splits \['train', 'test'\]\); point at one split"):
        Dataset.from_path("dd", str(tmp_path / "dd"))
    assert Dataset.from_path("dd", str(tmp_path / "dd" / "test")).total() == 5


def test_broken_state_json_is_named(tmp_path, hf_ds):
    hf_ds.save_to_disk(str(tmp_path / "t"))
    (tmp_path / "t" / "state.json").write_text('{"no": "files"}')
    with pytest.raises(DatasetFormatError, match=r"state\.json: not a Hugging Face save_to_disk state file"):
        Dataset.from_path("t", str(tmp_path / "t"))


def test_from_hf_is_zero_copy_over_the_arrow_table(hf_ds):
    ds = Dataset.from_hf("mem", hf_ds)
    assert ds.format.name == "inmem" and ds.total() == 500
    ours = ds.format.tables[0]
    theirs = hf_ds.data.table
    for name in theirs.column_names:
        assert [b.address for b in ours.column(name).chunk(0).buffers() if b is not None] == \
               [b.address for b in theirs.column(name).chunk(0).buffers() if b is not None]
    got = ds.open_reader().take(0, np.array([7, 3, 499]))
    assert got.to_pylist() == [hf_ds[7], hf_ds[3], hf_ds[499]]


def test_from_hf_flattens_an_indices_mapping(hf_ds):
    picked = hf_ds.shuffle(seed=1).select(range(20))
    ds = Dataset.from_hf("sel", picked)
    assert ds.total() == 20
    assert ds.open_reader().take(0, np.arange(20)).to_pylist() == picked.to_list()


def test_from_hf_keeps_the_format_columns(hf_ds):
    view = hf_ds.select_columns(["text", "n"])
    view.set_format(columns=["n"])
    assert Dataset.from_hf("v", view).open_reader().take(0, np.array([4])).to_pylist() == [{"n": 4}]


def test_from_hf_refuses_dicts_and_streams_saying_what_to_pass(hf_ds):
    with pytest.raises(ConfigError, match=r"DatasetDict with splits \['train'\]; pass one split.*hf\['train'\]"):
        Dataset.from_hf("x", datasets.DatasetDict({"train": hf_ds}))
    with pytest.raises(ConfigError, match="streaming datasets.IterableDataset.*without streaming=True"):
        Dataset.from_hf("x", hf_ds.to_iterable_dataset())
    with pytest.raises(ConfigError, match="expects a datasets.Dataset, got list"):
        Dataset.from_hf("x", [{"text": "a"}])


@pytest.mark.parametrize("writer", ["ipc_file", "ipc_stream", "feather_lz4"])
def test_plain_arrow_files_in_a_directory(tmp_path, writer):
    tables = [pa.table({"n": np.arange(s * 100, s * 100 + 100), "text": [f"t{i}" for i in range(100)]}) for s in range(2)]
    for s, t in enumerate(tables):
        path = str(tmp_path / f"part-{s}.{'feather' if writer == 'feather_lz4' else 'arrow'}")
        if writer == "feather_lz4":
            feather.write_feather(t, path)  # Feather V2, lz4-compressed by default
        else:
            with pa.OSFile(path, "wb") as sink:
                make = pa.ipc.new_file if writer == "ipc_file" else pa.ipc.new_stream
                with make(sink, t.schema) as w:
                    w.write_table(t, max_chunksize=30)
    ds = Dataset.from_path("a", str(tmp_path))
    assert ds.format.name == "arrow" and ds.counts().tolist() == [100, 100]
    rows = np.array([99, 0, 31, 31])
    assert ds.open_reader().take(1, rows).equals(tables[1].take(pa.array(rows)))


def test_a_file_that_is_not_arrow_is_named(tmp_path):
    (tmp_path / "x.arrow").write_bytes(b"FEA1 not arrow ipc at all")
    with pytest.raises(DatasetFormatError, match=r"x\.arrow: not an Arrow IPC file or stream"):
        Dataset.from_path("a", str(tmp_path))


def test_an_unreadable_arrow_file_is_a_permission_error_naming_it(tmp_path, deny_read):
    path = tmp_path / "part-0.arrow"
    feather.write_feather(pa.table({"n": np.arange(10)}), str(path))
    ds = Dataset.from_path("a", str(tmp_path))
    deny_read(path)
    for action in (lambda: ds.open_reader().take(0, np.array([1])), lambda: Dataset.from_path("a", str(tmp_path))):
        with pytest.raises(PermissionError, match=rf"^{re.escape(str(path))}: cannot be read \(Permission denied\)") as e:
            action()
        assert not isinstance(e.value, ValueError)  # not "not an Arrow IPC file"


def test_arrow_files_with_the_same_columns_in_another_order_read_in_the_first_files_order(tmp_path):
    feather.write_feather(pa.table({"n": [0, 1], "text": ["a", "b"]}), str(tmp_path / "part-0.arrow"))
    feather.write_feather(pa.table({"text": ["c"], "n": [2]}), str(tmp_path / "part-1.arrow"))
    reader = Dataset.from_path("a", str(tmp_path)).open_reader()
    assert reader.take(1, np.array([0])).to_pylist() == [{"n": 2, "text": "c"}]
    assert reader.take(1, np.array([0])).column_names == ["n", "text"]
