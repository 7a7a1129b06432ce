"""Every code block of the README and of docs/ runs as written: each page's Python blocks in
order as one script, in a fresh process, in a folder holding the data and tokenizer the pages
name (``data/web_parquet``, ``data/code_jsonl``, ``my_tokenizer/``); the README's command lines
too. The training loop of docs/training.md is run twice, stopped and resumed, and must train on
the batches an uninterrupted run trains on."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.ops._tokenizers import make_texts, make_tokenizer

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def blocks(page: Path, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(page.read_text()) if lang == language]


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """The folder the pages' examples run in: their data and tokenizer, made here."""
    root = tmp_path_factory.mktemp("docs")
    texts = [" ".join(make_texts(8, seed=s, max_words=40)[1:]) for s in range(300)]  # 200+ characters each
    (root / "data" / "web_parquet").mkdir(parents=True)
    for part in range(3):
        rows = texts[part * 70 : (part + 1) * 70]
        pq.write_table(pa.table({"id": list(range(len(rows))), "text": rows}),
                       root / "data" / "web_parquet" / f"part-{part}.parquet")
    (root / "data" / "code_jsonl").mkdir()
    for part in range(2):
        rows = texts[210 + part * 45 : 210 + (part + 1) * 45]
        (root / "data" / "code_jsonl" / f"part-{part}.jsonl").write_text(
            "".join(json.dumps({"text": t}) + "\n" for t in rows))
    (root / "my_tokenizer").mkdir()
    make_tokenizer().save(str(root / "my_tokenizer" / "tokenizer.json"))
    (root / "my_tokenizer" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "pad_token": "<pad>"}))
    return root


def run_python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = cwd / "page_example.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def test_every_page_with_python_blocks_is_found():
    with_code = {p.name for p in PAGES if blocks(p, "python")}
    assert {"README.md", "api.md", "training.md", "formats.md", "mixtures.md"} <= with_code


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, "python") and p.name != "training.md"],
                         ids=lambda p: p.name)
def test_a_pages_python_blocks_run_as_written(page, home, tmp_path):
    os.symlink(home / "data", tmp_path / "data")
    os.symlink(home / "my_tokenizer", tmp_path / "my_tokenizer")
    run = run_python("\n\n".join(blocks(page, "python")), tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]


def test_the_readmes_command_lines_run_as_written(home):
    lines = [line.split("#")[0].strip() for body in blocks(ROOT / "README.md", "bash") for line in body.splitlines()]
    commands = [line for line in lines if line.startswith(".venv/bin/python -m zephon_columnar")]
    assert len(commands) == 4  # inspect, bench, cache info, cache clear
    for command in commands:
        argv = [sys.executable, *command.split()[1:]]
        run = subprocess.run(argv, cwd=home, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert run.returncode == 0, command + "\n" + run.stderr[-3000:]


def test_the_training_loop_resumes_in_a_new_process_on_the_batches_it_would_have_had(home, tmp_path):
    (code,) = blocks(ROOT / "docs" / "training.md", "python")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    for folder in (whole, cut):
        folder.mkdir()
        os.symlink(home / "data", folder / "data")
        os.symlink(home / "my_tokenizer", folder / "my_tokenizer")
    uninterrupted = run_python(code, whole, STEPS="30")
    first = run_python(code, cut, STEPS="20")
    resumed = run_python(code, cut, STEPS="30")
    for run in (uninterrupted, first, resumed):
        assert run.returncode == 0, run.stderr[-3000:]
    steps = uninterrupted.stdout.splitlines()
    assert len(steps) == 30 and len(set(steps)) == 30
    assert first.stdout.splitlines() == steps[:20]
    assert resumed.stdout.splitlines() == steps[20:]  # steps 20-29, not a batch skipped or repeated
