"""``build_index``: the index it writes for each indexable format, and its command line."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from zephon_columnar.build_index import _cli, build_index
from zephon_columnar.io import Dataset

ROOT = Path(__file__).resolve().parents[1]


def _shards(index: str | Path) -> list[tuple[str, int]]:
    return [(s["basename"], s["num_rows"]) for s in json.loads(Path(index).read_text())["shards"]]


def test_vortex_folder_is_indexed_and_still_read_as_data(tmp_path):
    vortex = pytest.importorskip("vortex")
    for i, n in enumerate((3, 5)):
        vortex.io.write(vortex.array([{"id": j, "text": f"t{j}"} for j in range(n)]), str(tmp_path / f"p-{i}.vortex"))
    index = build_index("vortex", tmp_path, progress=False)
    assert index == str(tmp_path / "index.json")
    assert _shards(index) == [("p-0.vortex", 3), ("p-1.vortex", 5)]
    dataset = Dataset.from_path("v", str(tmp_path), fmt="vortex")  # index.json is not a shard
    assert [s.num_rows for s in dataset.shards] == [3, 5]


def test_cli_reads_sys_argv_and_writes_the_index(tmp_path, monkeypatch):
    (tmp_path / "a.jsonl").write_text('{"i":0}\n{"i":1}\n', encoding="utf-8")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as stream:
        stream.write('{"i":2}\n')
    monkeypatch.setattr(sys, "argv", ["build_index", "jsonl", str(tmp_path)])
    _cli()
    assert _shards(tmp_path / "index.json") == [("a.jsonl", 2), ("b.jsonl.gz", 1)]


@pytest.mark.parametrize("argv", [["jsonl"], ["no_such_format", "/nowhere"]])
def test_cli_exits_with_status_1_on_a_usage_error_or_a_failure(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        _cli(argv)
    assert exc.value.code == 1
    out, err = capsys.readouterr()
    assert ("Usage: python -m zephon_columnar.build_index" in out) if len(argv) == 1 else err.startswith("Error:")


def test_module_runs_as_a_command(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"i":0}\n', encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "zephon_columnar.build_index", "jsonl", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert _shards(tmp_path / "index.json") == [("a.jsonl", 1)]
    usage = subprocess.run([sys.executable, "-m", "zephon_columnar.build_index"], capture_output=True, text=True,
                           cwd=ROOT, timeout=120)
    assert usage.returncode == 1 and "Indexable formats: jsonl, parquet, vortex" in usage.stdout
