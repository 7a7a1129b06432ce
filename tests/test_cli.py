"""The command line (`zephon_columnar.cli`), run as users run it: ``python -m zephon_columnar``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import write_jsonl_dataset, write_parquet_dataset
from tests.ops._tokenizers import make_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zephon_columnar", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


@pytest.mark.parametrize("writer, fmt", [(write_parquet_dataset, "parquet"), (write_jsonl_dataset, "jsonl")])
def test_inspect_reports_format_shards_rows_schema_and_a_sample(tmp_path, writer, fmt):
    folder = writer(tmp_path / "d", shards=3, rows_per_shard=7)
    done = cli("inspect", str(folder), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["format"], report["shards"], report["rows"]) == (fmt, 3, 21)
    assert [s["rows"] for s in report["shard_list"]] == [7, 7, 7] and report["bytes"] > 0
    assert {"id", "text"} <= set(report["schema"]) and report["sample_row"]["id"] == 0
    text = cli("inspect", str(folder), "--shards", "1")
    assert text.returncode == 0 and f"format: {fmt}" in text.stdout and "... 2 more" in text.stdout


def test_inspect_shortens_long_values(tmp_path):
    pq.write_table(pa.table({"text": ["word " * 1000], "ids": [list(range(100))]}), tmp_path / "part-0.parquet")
    row = json.loads(cli("inspect", str(tmp_path), "--json").stdout)["sample_row"]
    assert row["text"].endswith("... (5,000 chars)") and row["ids"][-1] == "... (100 items)" and len(row["ids"]) == 17


def test_inspect_of_a_missing_folder_is_a_clear_error(tmp_path):
    done = cli("inspect", str(tmp_path / "nowhere"))
    assert done.returncode == 2 and "zephon_columnar inspect:" in done.stderr and "nowhere" in done.stderr
    assert "Traceback" not in done.stderr


def test_bench_tokenizes_packs_and_reports_throughput(tmp_path):
    folder = write_parquet_dataset(tmp_path / "d", shards=2, rows_per_shard=40)
    tokenizer = tmp_path / "tokenizer.json"
    make_tokenizer().save(str(tokenizer))
    done = cli("bench", str(folder), "--tokenizer", str(tokenizer), "--max-length", "16", "--batch", "2", "--json",
               "--progress-every", "0.01")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["batches"] > 5 and report["tokens"] == report["batches"] * 2 * 16
    assert report["tokens_per_s"] > 0 and 0 < report["first_batch_s"] <= report["seconds"]
    assert report["peak_rss_mb"] > 0
    assert "tokens" in done.stderr  # the progress readout


def test_bench_of_pretokenized_rows_with_a_bin_packer(tmp_path):
    tables = [pa.table({"input_ids": [list(range(i % 9 + 1)) for i in range(s * 50, s * 50 + 50)]}) for s in range(2)]
    for s, t in enumerate(tables):
        pq.write_table(t, tmp_path / f"part-{s}.parquet")
    done = cli("bench", str(tmp_path), "--tokens-field", "input_ids", "--algorithm", "first_fit", "--max-length",
               "12", "--batch", "4", "--max-batches", "3", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["batches"] == 3


def test_bench_needs_a_tokenizer_or_a_tokens_field(tmp_path):
    done = cli("bench", str(tmp_path))
    assert done.returncode == 2 and "--tokenizer" in done.stderr
