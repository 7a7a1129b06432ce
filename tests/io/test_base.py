"""`io.base.shard_info`: every reader looks a shard up by its id, never by its position."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
from pyarrow import feather
import pyarrow.parquet as pq
import pytest

from zephon_columnar.io import Dataset, ShardInfo
from zephon_columnar.io.base import shard_info


def table(shard: int, n: int) -> pa.Table:
    return pa.table({"id": np.arange(shard * 100, shard * 100 + n), "text": [f"s{shard}-r{r}" for r in range(n)]})


def write(kind: str, root, tables: list[pa.Table]) -> None:
    for s, t in enumerate(tables):
        if kind == "parquet":
            pq.write_table(t, root / f"part-{s}.parquet")
        elif kind == "jsonl":
            (root / f"part-{s}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in t.to_pylist()))
        else:
            feather.write_feather(t, str(root / f"part-{s}.arrow"))


def test_shard_info_finds_shards_by_id():
    shards = [ShardInfo(shard_id=2, path="a", num_rows=1), ShardInfo(shard_id=5, path="b", num_rows=1)]
    assert shard_info(shards, 5).path == "b" and shard_info(shards, 2).path == "a"
    for wrong in (0, 1, 3, -1):  # positions and unknown ids are refused, naming the ids
        with pytest.raises(IndexError, match=rf"shard {wrong} does not exist; this dataset has 2 shards with ids \[2, 5\]"):
            shard_info(shards, wrong)


@pytest.mark.parametrize("kind", ["parquet", "jsonl", "arrow"])
def test_file_readers_look_shards_up_by_id_not_position(tmp_path, kind):
    tables = [table(0, 3), table(1, 4)]
    write(kind, tmp_path, tables)
    found = Dataset.from_path("d", str(tmp_path))
    assert found.ids().tolist() == [0, 1]
    # The same files under ids 10 and 20 (a Dataset built by hand, e.g. from a manifest).
    renumbered = dataclasses.replace(found, shards=tuple(
        dataclasses.replace(s, shard_id=i) for s, i in zip(found.shards, (10, 20))))
    reader = renumbered.open_reader()
    assert reader.take(20, np.array([3, 0])).column("text").to_pylist() == ["s1-r3", "s1-r0"]
    assert reader.take(10, np.array([2])).column("text").to_pylist() == ["s0-r2"]
    with pytest.raises(IndexError, match=r"shard 1 does not exist.*ids \[10, 20\]"):
        reader.take(1, np.array([0]))  # position 1 holds shard 20: never read it as shard 1
