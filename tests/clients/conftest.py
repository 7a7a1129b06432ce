"""A corpus as the framework clients meet it: a JSONL source and a Parquet source of documents
of different lengths in local directories, and a local tokenizer directory (``tokenizer_id``)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.ops._tokenizers import make_texts, make_tokenizer, save_folder


@pytest.fixture(scope="session")
def client_corpus(tmp_path_factory) -> Path:
    """``web/`` (3 JSONL shards x 30 documents of 1-60 words), ``code/`` (2 Parquet shards x 30
    documents of 1-200 words) and ``tokenizer/`` (byte-level BPE; <s>=0, </s>=1, <pad>=2)."""
    root = tmp_path_factory.mktemp("clients")
    rng = random.Random(11)
    (root / "web").mkdir()
    for s in range(3):
        with open(root / "web" / f"part-{s}.jsonl", "w") as f:
            for text in make_texts(31, seed=rng.randrange(1 << 30))[1:]:
                f.write(json.dumps({"text": text}) + "\n")
    (root / "code").mkdir()
    for s in range(2):
        texts = make_texts(31, seed=rng.randrange(1 << 30), max_words=200)[1:]
        pq.write_table(pa.table({"text": texts}), root / "code" / f"part-{s}.parquet", row_group_size=8)
    save_folder(root / "tokenizer", make_tokenizer())
    return root
