"""Torch adapters: the pipeline as a ``torch.utils.data.IterableDataset``.

The pipeline already batches and runs its own workers, so use it with
``DataLoader(ds, batch_size=None, num_workers=0)``. Checkpointing works under that plain
``DataLoader`` (no torchdata needed): ``ds.state_dict()`` / ``ds.load_state_dict(sd)``.

With ``num_workers > 0`` each loader worker runs its own engine on a share of the lanes
(lane ``i`` of this rank goes to worker ``i % num_workers``); the loader's worker round robin
then reproduces the lanes' round robin when every worker owns the same number of lanes.

Example:
    >>> ds = pipe.to_torch_dataset(return_labels=True)  # doctest: +SKIP
    >>> loader = torch.utils.data.DataLoader(ds, batch_size=None)  # doctest: +SKIP
    >>> for step, tensors in enumerate(loader): ...  # doctest: +SKIP
    >>> ckpt = ds.state_dict()  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import os
import tempfile
import uuid
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import torch.utils.data

from zephon_columnar.errors import ConfigError

if TYPE_CHECKING:
    from zephon_columnar.pipeline import Pipeline


class PipelineIterableDataset(torch.utils.data.IterableDataset):
    """Yields the pipeline's items (or ``to_training`` dicts when keyword arguments were given)."""

    def __init__(self, pipeline: "Pipeline", *, stateful: bool = True,
                 to_training: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.stateful = stateful
        self.to_training = dict(to_training) if to_training else None
        # Loader workers iterate copies of this object in other processes; this file is how the
        # main process learns that its own pipeline is not the one that delivered the batches.
        self._worker_marker = os.path.join(tempfile.gettempdir(), f"zephon-columnar-ds-{uuid.uuid4().hex}")

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        pipe = self.pipeline
        if info is not None:
            with open(self._worker_marker, "w"):
                pass
        if info is not None and info.num_workers > 1:
            pipe = _worker_pipeline(pipe, info.id, info.num_workers)
        for item in pipe:
            yield item.to_training(**self.to_training) if self.to_training is not None else item

    def state_dict(self) -> dict[str, Any]:
        if not self.stateful:
            raise ConfigError("state_dict(): this dataset was built with to_torch_dataset(stateful=False).")
        if torch.utils.data.get_worker_info() is not None or os.path.exists(self._worker_marker):
            raise ConfigError("state_dict(): the batches were produced in DataLoader worker processes, so "
                              "this process cannot see what was delivered. Use DataLoader(num_workers=0): "
                              "the pipeline runs its own workers.")
        return {"pipeline": self.pipeline.checkpoint()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "pipeline" not in state:
            raise ConfigError(f"load_state_dict(): expected a dict from state_dict() with key 'pipeline', "
                              f"got keys {sorted(state)}.")
        self.pipeline.restore(state["pipeline"])

    def __del__(self) -> None:
        if torch.utils.data.get_worker_info() is None:
            try:
                os.remove(self._worker_marker)
            except OSError:
                pass


def _worker_pipeline(pipe: "Pipeline", worker: int, workers: int) -> "Pipeline":
    """A copy of ``pipe`` that serves only this loader worker's share of the rank's lanes."""
    from zephon_columnar.engine.lanes import owned_lanes

    o = pipe._options  # noqa: SLF001
    lanes = owned_lanes(canonical_replicas=o.resolved_canonical_replicas(), dp_degree=o.resolved_dp_degree(),
                        dp_group_id=o.resolved_dp_group_id(), mapping=o.resolved_mapping())
    if workers > len(lanes):
        raise ConfigError(f"DataLoader(num_workers={workers}) but this rank owns {len(lanes)} lane(s); use "
                          "num_workers=0 (recommended) or raise options(canonical_replicas=...).")
    clone = copy.copy(pipe)
    clone._lane_subset = lanes[worker::workers]  # noqa: SLF001
    clone._run = None  # noqa: SLF001
    return clone
