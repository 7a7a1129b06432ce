"""Torch adapter: DataLoader(batch_size=None) iteration and state_dict under a plain DataLoader."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import ConfigError

DS = Dataset.from_tables("a", [pa.table({"input_ids": [[i, i + 1, i + 2] for i in range(s * 20, s * 20 + 20)]})
                               for s in range(3)])


def build(lanes: int = 1) -> Pipeline:
    ws = StaticMixtureWorkSource([DS], {"a": 1.0}, chunk_size=8, seed=3, shuffle_within_shard=True)
    return Pipeline(ws).batch(4).options(canonical_replicas=lanes)


def rows(loader) -> list[list[list[int]]]:
    return [t["input_ids"].tolist() for t in loader]


def test_dataloader_yields_training_tensors():
    ds = build().to_torch_dataset(return_labels=True)
    out = list(DataLoader(ds, batch_size=None))
    assert len(out) == 15
    assert out[0]["input_ids"].shape == (4, 2) and out[0]["labels"].dtype == torch.int64


def test_state_dict_under_plain_dataloader_resumes_exactly():
    full = rows(DataLoader(build().to_torch_dataset(), batch_size=None, collate_fn=lambda b: b.to_training()))
    ds = build().to_torch_dataset()
    loader = DataLoader(ds, batch_size=None, collate_fn=lambda b: b.to_training())
    head = []
    for i, t in enumerate(loader):
        head.append(t["input_ids"].tolist())
        if i == 5:
            state = json.loads(json.dumps(ds.state_dict()))
            break
    ds2 = build().to_torch_dataset()
    ds2.load_state_dict(state)
    rest = rows(DataLoader(ds2, batch_size=None, collate_fn=lambda b: b.to_training()))
    assert head + rest == full


def test_worker_processes_split_lanes_and_cover_everything():
    single = sorted(map(str, rows(DataLoader(build(lanes=2).to_torch_dataset(return_padding_mask=True),
                                             batch_size=None))))
    multi = sorted(map(str, rows(DataLoader(build(lanes=2).to_torch_dataset(return_padding_mask=True),
                                            batch_size=None, num_workers=2))))
    assert multi == single


def test_load_state_dict_rejects_foreign_state():
    with pytest.raises(ConfigError, match="pipeline"):
        build().to_torch_dataset().load_state_dict({"engine": {}})


def test_state_dict_after_worker_iteration_refuses_instead_of_restarting():
    ds = build(lanes=2).to_torch_dataset()
    batches = list(DataLoader(ds, batch_size=None, num_workers=1))
    assert len(batches) == 15
    with pytest.raises(ConfigError, match="num_workers=0"):
        ds.state_dict()
