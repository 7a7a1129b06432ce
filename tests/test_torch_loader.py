"""`Pipeline.to_torch_loader`: the loader built right (batch_size=None, workers over the rank's
lanes, a safe start method, the to_training keywords checked once), and a hand-built DataLoader
that would re-batch the pipeline's batches stopped with an error that says what to pass."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import ConfigError
from zephon_columnar.torch import LoaderBatch

DS = Dataset.from_tables(
    "a", [pa.table({"input_ids": [[i, i + 1, i + 2, i + 3] for i in range(s * 20, s * 20 + 20)]}) for s in range(3)]
)


def build(lanes: int = 2) -> Pipeline:
    ws = StaticMixtureWorkSource([DS], {"a": 1.0}, chunk_size=8, seed=3, shuffle_within_shard=True)
    return Pipeline(ws).batch(4).options(canonical_replicas=lanes)


def signature(step: dict) -> tuple:
    return tuple(map(tuple, step["input_ids"].tolist()))


@pytest.mark.parametrize("keywords", [{"return_labels": True}, {}], ids=["to_training", "batches"])
def test_a_dataloader_with_the_default_batch_size_is_stopped_naming_the_fix(keywords):
    loader = DataLoader(build().to_torch_dataset(**keywords))  # torch's default batch_size=1
    with pytest.raises(TypeError, match=r"would add a leading dimension\. Pass DataLoader\(dataset, batch_size=None\)"):
        next(iter(loader))


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_yields_each_batch_once_as_tensors_in_the_datasets_order(workers):
    expected = [signature(b.to_training(return_labels=True)) for b in build()]
    loader = build().to_torch_loader(num_workers=workers, return_labels=True, timeout=120 if workers else 0)
    steps = list(loader)
    assert loader.batch_size is None and len(steps) == len(expected) == 15
    assert all(isinstance(s, LoaderBatch) and isinstance(s, dict) for s in steps)
    assert steps[0]["input_ids"].shape == (4, 3) and steps[0]["labels"].shape == (4, 3)
    assert steps[0]["input_ids"].dtype == torch.int64
    # The workers split the lanes and the loader's round robin puts the rank's order back.
    assert [signature(s) for s in steps] == expected


def test_without_keywords_the_loader_yields_training_tensors():
    """Found by a new-user probe: with no keyword the "torch loader" yielded SampleBatch objects,
    with any to_training keyword tensors."""
    steps = list(build().to_torch_loader(loader="plain"))
    expected = [b.to_training() for b in build()]
    assert len(steps) == 15 and isinstance(steps[0]["input_ids"], torch.Tensor)
    assert [s["input_ids"].tolist() for s in steps] == [e["input_ids"].tolist() for e in expected]
    raw = list(build().to_torch_loader(loader="plain", raw_batches=True))
    assert len(raw) == 15 and type(raw[0]).__name__ == "SampleBatch"
    with pytest.raises(TypeError, match="raw batches are not converted"):
        build().to_torch_loader(raw_batches=True, return_labels=True)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_stateful_loader_resumes_exactly(workers):
    from torchdata.stateful_dataloader import StatefulDataLoader

    timeout = 120 if workers else 0
    whole = [signature(s) for s in build().to_torch_loader(num_workers=workers, timeout=timeout, return_labels=True)]
    loader = build().to_torch_loader(num_workers=workers, timeout=timeout, return_labels=True)
    assert isinstance(loader, StatefulDataLoader)
    it = iter(loader)
    head = [signature(next(it)) for _ in range(6)]
    state = loader.state_dict()
    del it
    resumed = build().to_torch_loader(num_workers=workers, timeout=timeout, return_labels=True)
    resumed.load_state_dict(state)
    assert head + [signature(s) for s in resumed] == whole


def test_a_misspelt_to_training_keyword_is_refused_at_once_naming_the_closest():
    with pytest.raises(TypeError, match=r"to_torch_loader: 'return_label' is neither one of to_torch_loader's keywords nor a "
                                        r"to_training keyword; did you mean 'return_labels'\?"):
        build().to_torch_loader(return_label=True)
    with pytest.raises(TypeError, match=r"'shuffle' is not a to_training keyword; the keywords are \['tokens_field'"):
        build().to_torch_dataset(shuffle=True)
    with pytest.raises(ConfigError, match=r"return_loss_mask requires return_labels=True"):
        build().to_torch_loader(return_loss_mask=True)  # checked before any data is read


def test_bad_loader_arguments_are_refused():
    with pytest.raises(ConfigError, match=r"to_torch_loader\(loader='fast'\): use one of \['auto', 'stateful', 'plain'\]"):
        build().to_torch_loader(loader="fast")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"num_workers=-1"):
        build().to_torch_loader(num_workers=-1)


def test_without_torchdata_auto_falls_back_to_the_plain_loader_and_stateful_says_what_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torchdata.stateful_dataloader", None)  # as if torchdata were not installed
    assert type(build().to_torch_loader()) is DataLoader
    with pytest.raises(ImportError, match=r"pip install torchdata, or pass loader='plain'"):
        build().to_torch_loader(loader="stateful")


SCRIPT = """
import pyarrow as pa
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource

def main():
    ds = Dataset.from_tables("a", [pa.table({"input_ids": [[i, i + 1]] * 10}) for i in range(2)])
    ws = StaticMixtureWorkSource([ds], {"a": 1.0}, chunk_size=5, seed=0)
    loader = Pipeline(ws).batch(5).options(canonical_replicas=2).to_torch_loader(num_workers=2, timeout=120)
    print("batches", len(list(loader)))
"""


@pytest.mark.parametrize("guarded", [True, False])
def test_spawned_workers_need_the_main_guard_and_its_absence_is_named_at_once(tmp_path, guarded):
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(SCRIPT + ('if __name__ == "__main__":\n    main()\n' if guarded else "main()\n"))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    if guarded:
        assert run.returncode == 0 and "batches 4" in run.stdout, run.stderr[-2000:]
    else:  # without the check the parent waits forever writing the pipeline to a dying worker
        assert run.returncode != 0
        assert f"runs {script} again in each worker, and that script has no 'if __name__" in run.stderr
