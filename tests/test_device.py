"""The device hand-off (`zephon_columnar.device`): ``to_training(device=...)`` and
``to_torch_loader(device=..., prefetch=k)`` give the tensors the host path gives, moved; tokens
leave Arrow without a host copy (shared data pointers); the staging ring reuses its buffers; the
loader's state is the position after the batch the trainer holds, not after those crossing ahead.
Run on the CPU (the ring is plain memory there); the CUDA stream path is measured by
benchmarks/handoff.py where a device exists."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.device import DeviceLoader, StagingRing, TransferPlan
from zephon_columnar.errors import ConfigError
from zephon_columnar.training import TrainingOptions, to_training

ROWS = [[(7 * i + j) % 50 + 1 for j in range(3 + i % 9)] for i in range(120)]
DS = Dataset.from_tables("a", [pa.table({"input_ids": pa.array(ROWS[s::3], pa.list_(pa.int32()))}) for s in range(3)])


def build(lanes: int = 2) -> Pipeline:
    ws = StaticMixtureWorkSource([DS], {"a": 1.0}, chunk_size=8, seed=5, shuffle_within_shard=True)
    return Pipeline(ws).pack_flat(17, num_bins=4, emit_positions=True).batch(4).options(canonical_replicas=lanes)


OPTION_SETS = [
    {},
    {"return_labels": True, "return_loss_mask": True, "return_num_valid_tokens": True},
    {"return_labels": True, "return_cu_seqlens": True, "return_padding_mask": True},
    {"return_cu_seqlens": True, "flatten": True},
    {"return_labels": True, "dtype": torch.int32},
    {"rename_fields": {"cu_seqlens": "cu_seq_lens_q", "input_ids": "tokens"}, "return_cu_seqlens": True,
     "exclude_fields": ("texts",)},
    {"position_mode": "sequence", "return_labels": True, "eos_mask_loss": True, "eos_token_id": 3},
]


def assert_same_tensors(got: dict, expected: dict) -> None:
    assert list(got) == list(expected)
    for name, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert isinstance(got[name], torch.Tensor), name
            assert got[name].dtype == value.dtype and got[name].device.type == "cpu", name
            assert torch.equal(got[name], value), name
        else:
            assert got[name] == value, name


@pytest.mark.parametrize("keywords", OPTION_SETS, ids=range(len(OPTION_SETS)))
def test_to_training_on_a_device_gives_what_the_host_path_gives(keywords):
    for batch in list(build())[:6]:
        assert_same_tensors(batch.to_training(device="cpu", **keywords), batch.to_training(**keywords))


def test_token_ids_leave_arrow_without_a_host_copy_and_are_widened_on_the_device():
    batch = next(iter(Pipeline(StaticMixtureWorkSource([DS], {"a": 1.0}, chunk_size=8, seed=5)).batch(4)))
    batch = type(batch)(batch.table.select(["input_ids", *[c for c in batch.table.column_names if c.startswith("__")]]))
    tokens = batch.table.column("input_ids").chunk(0)
    ragged = tokens.value_lengths().to_pylist()
    assert len(set(ragged)) > 1  # ragged rows: padded on the host, so a copy there
    equal = pa.array([row[:3] for row in tokens.to_pylist()], pa.list_(pa.int32()))
    batch = type(batch)(batch.table.set_column(batch.table.column_names.index("input_ids"), "input_ids", equal))
    values = batch.table.column("input_ids").chunk(0).values
    address = values.buffers()[1].address + values.offset * 4

    options = TrainingOptions(device="cpu", return_labels=True)
    host = batch.to_training_with(options, on_host=True)
    assert host["input_ids"].dtype == torch.int32 and host["input_ids"].data_ptr() == address
    assert host["labels"].dtype == torch.int32  # built on the host (the loss mask), still narrow
    moved = batch.to_training_with(options)
    assert moved["input_ids"].dtype == torch.int64 and moved["input_ids"].data_ptr() != address
    moved["input_ids"].fill_(-1)  # a fresh tensor: the loader's memory is untouched
    assert batch.table.column("input_ids").to_pylist() == equal.to_pylist()


def test_sequence_metadata_keeps_int32_under_any_name():
    batch = next(iter(build()))
    keywords = {"return_cu_seqlens": True, "rename_fields": {"cu_seqlens": "input_ids", "input_ids": "cu_seqlens"}}
    out = batch.to_training(device="cpu", **keywords)
    assert out["input_ids"].dtype == torch.int32 and out["cu_seqlens"].dtype == torch.int64
    assert_same_tensors(out, batch.to_training(**keywords))


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"device": "gpu"}, r"device='gpu' is not a torch device; pass e\.g\. 'cuda'"),
        ({"device": "cpu", "dtype": None}, r"device='cpu' makes torch tensors, and dtype=None does not"),
        ({"device": "cpu", "dtype": np.int64}, r"pass dtype='auto' or a torch dtype"),
        ({"device": "cpu", "zero_copy": True}, r"zero_copy=True hands views .* drop one of them"),
        ({"non_blocking": True}, r"non_blocking applies to the copy to a device; pass device= too"),
    ],
)
def test_device_options_are_checked_before_any_data(keywords, message):
    with pytest.raises(ConfigError, match=message):
        TrainingOptions(**keywords)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_device_this_machine_lacks_is_refused_naming_what_it_has():
    with pytest.raises(ConfigError, match=r"device='cuda', but this torch has no cuda device .* pass device='cpu'"):
        build().to_torch_loader(device="cuda", return_labels=True)


def test_the_ring_reuses_its_buffers_and_grows_only_for_a_bigger_batch():
    ring = StagingRing(slots=3, pinned=False)
    source = torch.arange(40, dtype=torch.int32).reshape(4, 10)[:, :-1]  # strided, like input_ids
    places = []
    for step in range(9):
        staged = ring.stage({"input_ids": source + step, "loss_mask": torch.ones(4, 9), "ids": [step]})
        assert torch.equal(staged["input_ids"], source + step) and staged["input_ids"].is_contiguous()
        assert staged["ids"] == [step]
        places.append(staged["input_ids"].data_ptr())
    assert len(set(places)) == 3 and places[:3] * 3 == places  # one buffer per slot, in turn
    bigger = ring.stage({"input_ids": torch.zeros(64, 64, dtype=torch.int64)})
    assert bigger["input_ids"].data_ptr() != places[0]  # that slot grew
    again = ring.stage({"input_ids": source})
    assert again["input_ids"].data_ptr() == places[1]  # the others did not


@pytest.mark.parametrize(("workers", "loader", "prefetch"), [(0, "plain", 0), (0, "stateful", 1), (0, "plain", 3),
                                                             (2, "stateful", 2)])
def test_the_device_loader_yields_the_host_loaders_batches_and_resumes_after_the_one_handed_over(
    workers, loader, prefetch
):
    keywords = {"return_labels": True, "return_cu_seqlens": True}
    timeout = 120 if workers else 0
    expected = list(build().to_torch_loader(num_workers=workers, loader=loader, timeout=timeout, **keywords))
    device_loader = build().to_torch_loader(
        num_workers=workers, loader=loader, timeout=timeout, device="cpu", prefetch=prefetch, **keywords
    )
    assert isinstance(device_loader, DeviceLoader) and device_loader.loader.batch_size is None
    taken = []
    for step, tensors in enumerate(device_loader):
        taken.append(tensors)
        if step == 4:
            state = device_loader.state_dict()  # prefetch batches have been taken beyond this one
    assert len(taken) == len(expected) > 8
    for got, want in zip(taken, expected):  # every batch held to the end: none overwritten by the ring
        assert_same_tensors(got, dict(want))
    resumed = build().to_torch_loader(
        num_workers=workers, loader=loader, timeout=timeout, device="cpu", prefetch=prefetch, **keywords
    )
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(expected) - 5
    for got, want in zip(rest, expected[5:]):
        assert_same_tensors(got, dict(want))


class _FailsAt:
    """A loader whose batch ``at`` raises."""

    def __init__(self, at: int) -> None:
        self.at = at

    def __iter__(self):
        for step in range(10):
            if step == self.at:
                raise RuntimeError(f"batch {step} is broken")
            yield {"input_ids": torch.full((2, 3), step, dtype=torch.int32)}


def test_an_error_reaches_the_trainer_at_its_batch_not_prefetch_batches_early():
    loader = DeviceLoader(_FailsAt(4), TransferPlan(device=torch.device("cpu"), dtype=torch.int64), prefetch=3,
                          checkpoints=None)
    seen = []
    with pytest.raises(RuntimeError, match="batch 4 is broken"):
        for tensors in loader:
            seen.append(int(tensors["input_ids"][0, 0]))
    assert seen == [0, 1, 2, 3]


def test_device_options_of_the_loader_are_checked():
    with pytest.raises(ConfigError, match=r"prefetch=2\) is how many batches cross to the device .* pass device="):
        build().to_torch_loader(prefetch=2, return_labels=True)
    with pytest.raises(ConfigError, match=r"stages batches in pinned memory itself; drop pin_memory=True"):
        build().to_torch_loader(device="cpu", pin_memory=True)
    with pytest.raises(ConfigError, match=r"prefetch=-1\): pass an int >= 0"):
        build().to_torch_loader(device="cpu", prefetch=-1)


def test_a_hand_built_loader_does_not_start_the_device_in_its_workers():
    dataset = build().to_torch_dataset(device="cpu", return_labels=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1, multiprocessing_context="spawn",
                                         timeout=120)
    with pytest.raises(ConfigError, match=r"in a DataLoader worker would start the device there; .*to_torch_loader"):
        next(iter(loader))


def test_to_training_of_the_functional_form_takes_the_device_too():
    batch = next(iter(build()))
    options = TrainingOptions(device="cpu", return_labels=True)
    assert_same_tensors(to_training(batch.table, options), batch.to_training(return_labels=True))


def test_a_trainer_that_stops_early_stops_the_prefetch_thread():
    import threading

    loader = build().to_torch_loader(device="cpu", prefetch=2, return_labels=True)
    batches = iter(loader)
    next(batches), next(batches)
    assert any(t.name == "zephon_columnar-device-prefetch" for t in threading.enumerate())
    batches.close()
    assert not any(t.name == "zephon_columnar-device-prefetch" for t in threading.enumerate())
    assert len(list(loader)) > 8  # and the loader iterates again from the start


def test_a_failure_staging_a_batch_reaches_the_trainer_instead_of_a_wait(monkeypatch):
    from zephon_columnar import device

    def broken(self, tensors):
        raise MemoryError("no room to stage")

    monkeypatch.setattr(device.StagingRing, "stage", broken)
    loader = DeviceLoader(_FailsAt(99), TransferPlan(device=torch.device("cpu"), dtype=torch.int64), prefetch=2,
                          checkpoints=None)
    with pytest.raises(MemoryError, match="no room to stage"):
        next(iter(loader))
