"""The command line (`zephon_columnar.cli`), run as users run it: ``python -m zephon_columnar``."""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import write_jsonl_dataset, write_parquet_dataset
from tests.ops._tokenizers import make_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zephon_columnar", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env=env)


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


def test_version_and_the_console_script():
    from importlib.metadata import entry_points

    import zephon_columnar

    done = cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"zephon_columnar {zephon_columnar.__version__}"
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "zephon-columnar"]
    assert script.value == "zephon_columnar.cli:entry"


def mixture_data(tmp_path: Path) -> tuple[Path, Path, Path]:
    texts = [" ".join(["word"] * (3 + i % 40)) for i in range(120)]
    web, code = tmp_path / "web", tmp_path / "code"
    web.mkdir()
    code.mkdir()
    pq.write_table(pa.table({"text": texts[:80]}), web / "part-0.parquet")
    (code / "part-0.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[80:]))
    tokenizer = tmp_path / "tokenizer.json"
    make_tokenizer().save(str(tokenizer))
    return web, code, tokenizer


def test_bench_over_a_mixture_with_a_shuffle_and_a_bin_packer_counts_real_and_padded_tokens(tmp_path):
    web, code, tokenizer = mixture_data(tmp_path)
    done = cli("bench", str(web), str(code), "--weights", "0.7,0.3", "--tokenizer", str(tokenizer), "--shuffle",
               "32", "--algorithm", "first_fit", "--num-bins", "4", "--max-length", "64", "--batch", "2", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["weights"] == [0.7, 0.3] and report["shuffle"] == 32 and report["batches"] > 3
    assert report["tokens"] == report["batches"] * 2 * 64 > report["real_tokens"] > 0  # first_fit pads
    assert report["padding_share"] == round(1 - report["real_tokens"] / report["tokens"], 4) > 0


def test_a_recipe_file_gives_the_settings_and_flags_win(tmp_path):
    web, code, tokenizer = mixture_data(tmp_path)
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"paths": [str(web), str(code)], "weights": [0.5, 0.5], "tokenizer": str(tokenizer),
                                  "max_length": 32, "batch": 2, "algorithm": "best_fit_wrap"}))
    by_flags = cli("bench", str(web), str(code), "--weights", "0.5,0.5", "--tokenizer", str(tokenizer),
                   "--max-length", "32", "--batch", "2", "--algorithm", "best_fit_wrap", "--json")
    by_file = cli("bench", "--recipe", str(recipe), "--json")
    overridden = cli("bench", "--recipe", str(recipe), "--batch", "4", "--json")
    reports = [json.loads(d.stdout.strip().splitlines()[-1]) for d in (by_flags, by_file, overridden)]
    assert reports[0]["batches"] == reports[1]["batches"] and reports[0]["real_tokens"] == reports[1]["real_tokens"]
    assert reports[2]["batches"] == reports[1]["batches"] // 2  # --batch 4 over the file's 2
    recipe.write_text(json.dumps({"paths": [str(web)], "tokeniser": str(tokenizer)}))
    done = cli("bench", "--recipe", str(recipe))
    assert done.returncode == 2 and "unknown settings ['tokeniser']" in done.stderr


def test_eos_token_id_for_a_tokenizer_that_names_none(tmp_path):
    web, _, _ = mixture_data(tmp_path)
    bare = tmp_path / "bare.json"
    make_tokenizer(("<unk>", "<sep>")).save(str(bare))
    without = cli("bench", str(web), "--tokenizer", str(bare), "--max-length", "32", "--json")
    assert without.returncode == 2 and "eos" in without.stderr.lower()
    given = cli("bench", str(web), "--tokenizer", str(bare), "--eos-token-id", "1", "--max-length", "32", "--json")
    assert given.returncode == 0, given.stderr


# ------------------------------------------------------------------ bad command lines: one row each
def _recipe_with_a_trailing_comma(tmp_path: Path) -> list[str]:
    recipe = tmp_path / "recipe.json"
    recipe.write_text('{"paths": ["data"],\n "shuffle": 8,}\n')
    return ["bench", "--recipe", str(recipe)]


def _a_wrong_text_field(tmp_path: Path) -> list[str]:
    web, _, tokenizer = mixture_data(tmp_path)
    return ["bench", str(web), "--tokenizer", str(tokenizer), "--field", "txt"]


def _a_wrong_tokens_field(tmp_path: Path) -> list[str]:
    pq.write_table(pa.table({"input_ids": [[1, 2]], "text": ["a"]}), tmp_path / "part-0.parquet")
    return ["bench", str(tmp_path), "--tokens-field", "ids"]


#: (id, argv(tmp_path), words stderr must hold (a regex each)); every one exits 2, no traceback.
BAD_COMMAND_LINES = [
    ("recipe-not-json", _recipe_with_a_trailing_comma,
     [r"ConfigError: --recipe .*recipe\.json: not valid JSON at line 2, column 15"]),
    ("field-not-a-column", _a_wrong_text_field,
     [r"--field 'txt' is not a column of .*web", r"its columns: \['text'\]", r"Pass e\.g\. --field text\."]),
    ("tokens-field-not-a-column", _a_wrong_tokens_field,
     [r"--tokens-field 'ids' is not a column", r"\['input_ids', 'text'\]", r"--tokens-field input_ids\."]),
    ("inspect-negative-shards", lambda t: ["inspect", str(t), "--shards", "-1"],
     [r"argument --shards: -1 is negative; pass a count >= 0"]),
    ("bench-negative-max-batches", lambda t: ["bench", str(t), "--max-batches", "-3"],
     [r"argument --max-batches: -3 is negative"]),
]


@pytest.mark.parametrize("argv, words", [row[1:] for row in BAD_COMMAND_LINES], ids=[row[0] for row in BAD_COMMAND_LINES])
def test_a_bad_command_line_exits_2_naming_the_problem_and_the_fix(tmp_path, argv, words):
    done = cli(*argv(tmp_path))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    for pattern in words:
        assert re.search(pattern, done.stderr), f"{pattern!r} not in: {done.stderr}"


def test_format_offers_every_registered_format(tmp_path):
    from zephon_columnar.io.registry import formats

    for command in ("inspect", "bench"):
        usage = cli(command, "--help").stdout
        assert all(f.name in usage for f in formats()), usage
    with tarfile.open(tmp_path / "shard-000.tar", "w") as archive:
        for key in ("a", "b"):
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = 5
            archive.addfile(info, io.BytesIO(b"hello"))
    done = cli("inspect", str(tmp_path), "--format", "webdataset", "--json")
    assert done.returncode == 0, done.stderr
    assert (json.loads(done.stdout)["format"], json.loads(done.stdout)["rows"]) == ("webdataset", 2)


def test_bench_states_the_share_of_tokens_packing_dropped(tmp_path):
    ids = [list(range(100)) if i % 10 else list(range(5)) for i in range(200)]  # 9 in 10 longer than 16
    pq.write_table(pa.table({"input_ids": ids}), tmp_path / "part-0.parquet")
    argv = ["bench", str(tmp_path), "--tokens-field", "input_ids", "--algorithm", "first_fit", "--max-length", "16",
            "--batch", "2"]
    done = cli(*argv)
    assert done.returncode == 0, done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    assert "99.5% of tokens dropped (18,000 in documents longer than --max-length 16" in summary, summary
    assert "--algorithm wrap" in summary and "1 final row(s) short of a batch dropped" in summary, summary
    report = json.loads(cli(*argv, "--json").stdout.strip().splitlines()[-1])
    assert (report["dropped_oversized_tokens"], report["dropped_share"], report["dropped_final_rows"]) == (18000, 0.9945, 1)


def test_cache_info_and_clear(tmp_path):
    import os

    root = tmp_path / "cache"
    env = {**os.environ, "ZEPHON_COLUMNAR_CACHE": str(root)}
    folder = write_jsonl_dataset(tmp_path / "d", shards=2, rows_per_shard=5)
    assert cli("inspect", str(folder), env=env).returncode == 0  # writes the JSONL indexes
    info = json.loads(cli("cache", "info", "--json", env=env).stdout)
    by_name = {f["name"]: f for f in info["folders"]}
    assert info["root"] == str(root) and {"shards", "jsonl_index", "tar_index"} <= set(by_name)
    assert by_name["jsonl_index"]["files"] == 2 and by_name["jsonl_index"]["bytes"] > 0
    text = cli("cache", "info", env=env).stdout
    assert f"cache root: {root}" in text and "jsonl_index (JSONL line indexes and schemas): 2 files" in text
    cleared = cli("cache", "clear", env=env)
    assert cleared.returncode == 0 and f"removed {root / 'jsonl_index'} (2 files" in cleared.stdout
    assert not root.exists()
    assert "nothing to remove" in cli("cache", "clear", env=env).stdout


def test_cache_clear_refuses_a_folder_that_is_not_the_cache(tmp_path):
    import os

    (tmp_path / "jsonl_index").mkdir()
    (tmp_path / "thesis.tex").write_text("mine")
    done = cli("cache", "clear", env={**os.environ, "ZEPHON_COLUMNAR_CACHE": str(tmp_path)})
    assert done.returncode == 2 and "holds ['thesis.tex']" in done.stderr and "nothing was removed" in done.stderr
    assert (tmp_path / "thesis.tex").exists() and (tmp_path / "jsonl_index").exists()
