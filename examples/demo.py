"""The demo: real text on disk -> mixture of two datasets -> filter -> tokenize -> pack into rows
of 257 tokens -> batches of torch tensors, with the library's progress readout (show_progress),
rows/s and tokens/s, and a checkpoint/resume check.

    make demo            (or: python examples/demo.py [--docs N])
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import torch  # noqa: F401 - a training loop has torch loaded; keeps its import out of the timing
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_data import write_demo_data  # noqa: E402

import zephon_columnar as zephon  # noqa: E402


def train_tokenizer(texts_dir: Path, out: Path) -> str:
    import pyarrow.parquet as pq

    texts = pa.concat_tables([pq.read_table(p) for p in sorted(texts_dir.glob("*.parquet"))]).column("text")
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts.to_pylist(), trainers.BpeTrainer(vocab_size=4000, special_tokens=["[PAD]", "[EOS]", "[UNK]"], show_progress=False))
    tok.save(str(out))
    return str(out)


def build(parquet_dir: Path, jsonl_dir: Path, tok_path: str) -> zephon.Pipeline:
    docs = zephon.Dataset.from_path("docs", str(parquet_dir))
    more = zephon.Dataset.from_path("more_docs", str(jsonl_dir))
    ws = zephon.StaticMixtureWorkSource([docs, more], zephon.MixtureSpec({"docs": 0.7, "more_docs": 0.3}),
                                        chunk_size=512, seed=2026, shuffle_within_shard=True)
    return (zephon.Pipeline(ws)
            .filter(pl.col("text").str.len_chars() >= 40)          # columnar, no Python per row
            .map_transform(pl.col("text").str.strip_chars())
            .tokenize(tokenizer_id=tok_path, field="text", special_tokens="eos", eos_token_id=1,
                      add_attention_mask=False)
            .pack_flat(257, algorithm="wrap", pad_token_id=0)       # rows of exactly 257 tokens
            .batch(8))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--docs", type=int, default=6000, help="number of docstrings to write")
    ap.add_argument("--data", default=".demo_data", help="where to write the dataset")
    args = ap.parse_args()
    root = Path(args.data)
    parquet_dir, jsonl_dir = write_demo_data(root, docs=args.docs)
    tok_path = train_tokenizer(parquet_dir, root / "tokenizer.json")
    print(f"data: {parquet_dir} (Parquet) + {jsonl_dir} (JSONL), tokenizer: {tok_path}")

    pipe = build(parquet_dir, jsonl_dir, tok_path)
    print(pipe.explain())
    pipe.show_progress(every_s=0.5)  # the library's readout: tokens/s real and padded, pass and ETA
    t0 = time.perf_counter()
    rows = tokens = 0
    signatures, ckpt, cut = [], None, 10
    for i, batch in enumerate(pipe, 1):
        t = batch.to_training(return_labels=True, return_padding_mask=True, return_num_valid_tokens=True)
        rows += len(batch)
        tokens += t["num_valid_tokens"]
        signatures.append(t["input_ids"].tolist())
        if i == cut:
            ckpt = json.dumps(pipe.checkpoint())  # what a trainer saves next to its weights
    dt = time.perf_counter() - t0
    # A row of 257 tokens trains on 256: each input predicts the next token (labels are the row
    # shifted by one), so the trained tokens are one a row fewer than the tokens the progress
    # line above counts.
    print(f"{len(signatures)} batches, {rows} rows, {tokens:,} trained tokens (256 of each row's 257) in {dt:.2f} s: "
          f"{rows / dt:,.0f} rows/s, {tokens / dt:,.0f} trained tokens/s")

    resumed = build(parquet_dir, jsonl_dir, tok_path)
    resumed.restore(json.loads(ckpt))
    t1 = time.perf_counter()
    rest = [b.to_training(return_labels=True)["input_ids"].tolist() for b in resumed]
    ok = signatures[cut:] == rest
    print(f"checkpoint after batch {cut} ({len(ckpt)} bytes of JSON), restored into a fresh pipeline: "
          f"{len(rest)} batches in {time.perf_counter() - t1:.2f} s, identical to the uninterrupted run: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
