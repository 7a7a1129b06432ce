"""SampleBatch.to_training: shapes, dtypes, padding and masks, against plain numpy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError
from zephon_columnar.types import PADDING_LENGTH, SampleBatch, SampleMeta, SampleRecord


def make_batch(rows: list[list[int]], *, value_type=pa.int32(), extra: dict | None = None) -> SampleBatch:
    n = len(rows)
    book = F.pointer_frame(lane=1, chunk_id=2, offsets=np.arange(n),
                           pointers=np.array([[0, 3, 10 + i] for i in range(n)]), components=np.zeros(n, np.int32))
    cols = {"input_ids": pa.array(rows, pa.list_(value_type))}
    cols.update(extra or {})
    return SampleBatch(F.with_payload(book, pa.table(cols)))


def test_equal_length_rows_become_int64_matrix():
    rows = [[1, 2, 3, 4], [5, 6, 7, 8]]
    out = make_batch(rows).to_training()
    assert out["input_ids"].dtype == torch.int64
    assert out["input_ids"].tolist() == rows
    assert out["ids"] == [(0, 3, 10), (0, 3, 11)]
    assert out["texts"] == ["", ""]


def test_ragged_rows_are_padded_and_masked():
    out = make_batch([[1, 2, 3], [4]]).to_training(return_padding_mask=True)
    assert out["input_ids"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert out["padding_mask"].tolist() == [[False, False, False], [False, True, True]]
    out = make_batch([[1, 2, 3, 4], [5, 6]]).to_training(
        return_labels=True, return_padding_mask=True, return_num_valid_tokens=True, return_loss_mask=True)
    assert out["labels"].tolist() == [[2, 3, 4], [6, -100, -100]]
    assert out["padding_mask"].tolist() == [[False, False, False], [False, False, True]]  # input-aligned
    assert out["num_valid_tokens"] == 4
    assert out["loss_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


def test_labels_shift_and_ignore_pad():
    out = make_batch([[1, 2, 3], [4, 5]]).to_training(return_labels=True, return_num_valid_tokens=True,
                                                      pad_token_id=9)
    assert out["input_ids"].tolist() == [[1, 2], [4, 5]]
    assert out["labels"].tolist() == [[2, 3], [5, -100]]
    assert out["num_valid_tokens"] == 3


def test_loss_mask_field_and_eos_mask():
    rows = [[1, 2, 0, 3]]
    lm = pa.array([[1, 1, 1, 0]], pa.list_(pa.int8()))
    out = make_batch(rows, extra={"loss_mask": lm}).to_training(
        return_labels=True, eos_mask_loss=True, eos_token_id=0)
    # labels: [2, 0, 3]; loss_mask[1:] = [1, 1, 0] masks label 3; input 0 at position 2 masks it too
    assert out["labels"].tolist() == [[2, 0, -100]]


def test_positions_and_cu_seqlens():
    pos = pa.array([[0, 1, 0, 1, 2, 0]], pa.list_(pa.int32()))
    out = make_batch([[7, 7, 7, 7, 7, 7]], extra={"positions": pos}).to_training(return_cu_seqlens=True)
    assert out["positions"].tolist() == [[0, 1, 0, 1, 2, 0]]
    assert out["cu_seqlens"].tolist() == [[0, 2, 5, 6]]
    assert out["max_seqlen"].tolist() == [3]
    flat = make_batch([[7] * 6, [7] * 6], extra={"positions": pa.array([[0, 1, 2, 0, 1, 2]] * 2,
                                                                        pa.list_(pa.int32()))}).to_training(
        return_cu_seqlens=True, flatten=True)
    assert flat["input_ids"].shape == (12,)
    assert flat["cu_seqlens"].tolist() == [0, 3, 6, 9, 12]


def test_position_mode_sequence():
    out = make_batch([[5, 6, 7]]).to_training(position_mode="sequence")
    assert out["positions"].tolist() == [[0, 1, 2]]


def test_packed_padding_length_is_masked():
    batch = make_batch([[1, 2, 9, 9]])
    batch = SampleBatch(batch.table.append_column(PADDING_LENGTH, pa.array([2], pa.int32())))
    out = batch.to_training(return_padding_mask=True, return_labels=True)
    assert out["padding_mask"].tolist() == [[False, False, True]]
    assert out["labels"].tolist() == [[2, -100, -100]]


def test_dtype_none_numpy_rename_exclude():
    b = make_batch([[1, 2]])
    assert b.to_training(dtype=None)["input_ids"] == [[1, 2]]
    assert b.to_training(dtype=np.int32)["input_ids"].dtype == np.int32
    out = b.to_training(rename_fields={"input_ids": "tokens"}, exclude_fields=("texts",))
    assert "tokens" in out and "texts" not in out


def test_errors_name_the_field():
    b = make_batch([[1, 2]])
    with pytest.raises(ConfigError, match="nope"):
        b.to_training(tokens_field="nope")
    with pytest.raises(ConfigError, match="eos_token_id"):
        b.to_training(eos_mask_loss=True)
    with pytest.raises(ConfigError, match="requires an explicit eos_token_id"):
        b.to_training(eos_mask_loss=True, return_labels=True)
    book = F.pointer_frame(lane=0, chunk_id=0, offsets=np.arange(1), pointers=np.zeros((1, 3), np.int64),
                           components=np.zeros(1, np.int32))
    with pytest.raises(ConfigError, match="Cannot auto-detect tokens field"):
        SampleBatch(F.with_payload(book, pa.table({"text": ["x"]}))).to_training()


def test_records_view():
    b = make_batch([[1, 2], [3]])
    recs = b.records
    ids = [r.payload["input_ids"] for r in recs]  # numpy views of the column, read-only (Zephon's)
    assert [a.tolist() for a in ids] == [[1, 2], [3]]
    assert all(isinstance(a, np.ndarray) and not a.flags.writeable for a in ids)
    assert recs[1].meta.sample_id == (0, 3, 11) and recs[1].meta.lane_id == 1 and recs[1].meta.chunk_id == 2


def test_tensors_do_not_alias_loader_memory_unless_asked():
    batch = make_batch([[1, 2], [3, 4]], value_type=pa.int64())
    out = batch.to_training()
    out["input_ids"].fill_(-1)
    assert batch.table.column("input_ids").to_pylist() == [[1, 2], [3, 4]]
    view = batch.to_training(zero_copy=True)["input_ids"]
    values = batch.table.column("input_ids").chunk(0).flatten()
    assert view.data_ptr() == values.buffers()[1].address + values.offset * 8


def test_torch_dtype_with_labels_on_ragged_rows():
    out = make_batch([[1, 2, 3], [4]]).to_training(dtype=torch.int32, return_labels=True)
    assert out["input_ids"].dtype == torch.int32 and out["labels"].tolist() == [[2, 3], [-100, -100]]


def test_null_token_names_the_field_and_row():
    with pytest.raises(ConfigError, match="input_ids.*row 1"):
        make_batch([[1, 2], [3, None]]).to_training()


def test_cu_seqlens_count_the_pad_tail_once():
    pos = pa.array([[0, 1], [0, 1, 0, 1]], pa.list_(pa.int32()))
    out = make_batch([[5, 5], [6, 6, 6, 6]], extra={"positions": pos}).to_training(return_cu_seqlens=True)
    assert out["cu_seqlens"].tolist() == [[0, 2, 4], [0, 2, 4]]


# ---------------------------------------------------------------- Zephon's contract
def rec(i: int, payload, *, pad: int | None = None, lane: int = 0, chunk: int = 0) -> SampleRecord:
    tags = {} if pad is None else {"padding_length": pad}
    return SampleRecord(meta=SampleMeta(sample_id=(0, 0, i), lane_id=lane, chunk_id=chunk, tags=tags),
                        payload=payload)


def test_batch_of_records_keeps_them_and_has_zephons_attributes():
    records = (rec(0, {"input_ids": [1, 2]}, lane=7, chunk=3), rec(1, np.array([3, 4]), lane=7, chunk=4))
    batch = SampleBatch(records=records)
    assert len(batch) == 2 and batch.records == records
    assert batch.ids == ((0, 0, 0), (0, 0, 1))
    assert batch.lane_ids == (7, 7) and batch.chunk_ids == (3, 4) and batch.lineage_paths == ((), ())
    arrow = make_batch([[1, 2], [3, 4]])
    assert arrow.lane_ids == (1, 1) and arrow.chunk_ids == (2, 2)


def test_records_with_array_payloads_stack_as_token_rows():
    for row in (np.array([1, 2, 3]), torch.tensor([1, 2, 3])):
        out = SampleBatch(records=(rec(0, row), rec(1, row + 3))).to_training(return_labels=True)
        assert out["input_ids"].dtype == torch.int64
        assert out["input_ids"].tolist() == [[1, 2], [4, 5]] and out["labels"].tolist() == [[2, 3], [5, 6]]
        assert out["texts"] == ["", ""]
    with pytest.raises(TypeError, match="mixed payload types"):
        SampleBatch(records=(rec(0, np.array([1])), rec(1, {"input_ids": [1]}))).to_training()
    with pytest.raises(TypeError, match="dict or array-like"):
        SampleBatch(records=(rec(0, "text"),)).to_training()


def test_records_lists_keep_ragged_rows_and_mask_the_pad_tail_by_position():
    batch = SampleBatch(records=(rec(0, {"input_ids": [5, 0, 7, 0, 0]}, pad=2), rec(1, {"input_ids": [8, 9]})))
    out = batch.to_training(dtype=None, return_labels=True, return_padding_mask=True, return_loss_mask=True,
                            return_num_valid_tokens=True)
    assert out["input_ids"] == [[5, 0, 7, 0], [8]]
    assert out["labels"] == [[0, 7, -100, -100], [9]]  # the in-content 0 stays supervised
    assert out["padding_mask"] == [[False, False, False, True], [False]]
    assert out["loss_mask"] == [[1.0, 1.0, 0.0, 0.0], [1.0]] and out["num_valid_tokens"] == 3
    with pytest.raises(ConfigError, match="'input_ids'.*dtype=None"):
        batch.to_training()  # ragged rows do not stack into a tensor


def test_records_loss_mask_positions_and_cu_seqlens():
    payload = {"input_ids": [1, 2, 3, 4, 5], "loss_mask": [0, 1, 1, 0, 1], "positions": [0, 1, 2, 0, 1]}
    batch = SampleBatch(records=(rec(0, payload),))
    out = batch.to_training(dtype=np.int64, return_labels=True, return_cu_seqlens=True, flatten=True)
    assert out["labels"].tolist() == [2, 3, -100, 5] and out["positions"].tolist() == [0, 1, 2, 0]
    assert out["cu_seqlens"].tolist() == [0, 3, 4] and out["max_seqlen"] == 3
    assert batch.to_training(dtype=None)["loss_mask"] == [[0, 1, 1, 0, 1]]  # passed through without labels
    with pytest.raises(ConfigError, match="'loss_mask' present in some payloads"):
        SampleBatch(records=(rec(0, payload), rec(1, {"input_ids": [1] * 5, "positions": [0] * 5}))).to_training(
            dtype=None)


def test_option_conflicts_are_rejected_before_reading_rows():
    empty = SampleBatch(records=())
    assert empty.to_training(return_labels=True, return_num_valid_tokens=True) == \
        {"ids": [], "texts": [], "num_valid_tokens": 0}
    for options, message in [({"return_loss_mask": True}, "return_loss_mask requires return_labels=True"),
                             ({"return_num_valid_tokens": True}, "requires return_labels=True"),
                             ({"position_mode": "doc"}, r"to_training\(position_mode='doc'\): position_mode must be one of"),
                             ({"eos_token_id": -1}, "nonnegative integer"),
                             ({"return_labels": True, "extra_fields": ["loss_mask"]}, "not label-aligned")]:
        with pytest.raises(ConfigError, match=message):
            empty.to_training(**options)
    with pytest.raises(TypeError, match="not a string"):
        empty.to_training(exclude_fields="ids")
    with pytest.warns(UserWarning, match="eos_token_id is ignored"):
        make_batch([[1, 2]]).to_training(eos_token_id=2)


def test_arrow_batches_follow_the_same_output_contract():
    b = make_batch([[1, 2, 3]], extra={"loss_mask": pa.array([[0, 1, 1]], pa.list_(pa.int8())),
                                       "positions": pa.array([[0, 1, 0]], pa.list_(pa.int32()))})
    assert b.to_training()["loss_mask"].tolist() == [[0, 1, 1]]
    out = b.to_training(return_labels=True, return_cu_seqlens=True, flatten=True)
    assert out["labels"].tolist() == [2, 3] and out["max_seqlen"] == 2 and isinstance(out["max_seqlen"], int)
    with pytest.raises(ConfigError, match="target keys collide"):
        b.to_training(rename_fields={"input_ids": "texts"})
    with pytest.raises(ConfigError, match="source keys not in output"):
        b.to_training(rename_fields={"labels": "targets"})
    with pytest.raises(ConfigError, match="cannot overwrite generated field 'input_ids'"):
        make_batch([[1, 2]], extra={"tokens": pa.array([[1, 2]])}).to_training(
            tokens_field="tokens", extra_fields=["input_ids"])
    with pytest.raises(ConfigError, match="requires a 'positions' field"):
        make_batch([[1, 2]]).to_training(return_cu_seqlens=True)


@pytest.mark.parametrize("caller, warned", [("loader", 0), ("user", 1)])
def test_the_read_only_tensor_warning_is_silenced_for_the_loader_only(caller, warned):
    """types.py silences torch's "not writable" warning for its zero-copy views, and only for
    its own calls: a user's torch.from_numpy of a read-only array still warns. A fresh process
    each (torch warns once per process)."""
    call = {"loader": "make_batch([[1, 2], [3, 4]], value_type=pa.int64()).to_training(zero_copy=True)",
            "user": "torch.from_numpy(np.frombuffer(bytes(16), np.int64))"}[caller]
    script = (
        "import warnings, numpy as np, pyarrow as pa, torch\n"
        "from tests.test_types import make_batch\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        f"    {call}\n"
        "print(sum('not writable' in str(w.message) for w in seen))\n")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.split() == [str(warned)], out.stdout + out.stderr
