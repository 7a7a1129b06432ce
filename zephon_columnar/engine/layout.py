"""The data-parallel layout of a run: which group of how many this process reads, settled once.

Options may name the layout in several ways: ``world_size``/``global_rank`` (every rank its own
data-parallel group, or ``world_size / dp_degree`` tensor-parallel peers per group),
``dp_degree``/``dp_group_id`` (the data-parallel world only, as tensor-parallel jobs pass it),
or both. A half-given layout used to fall back to rank 0 on every rank, so every rank read the
same batches in silence. `settle_layout` completes the options from the launcher's world
(`ProcessWorld`: an initialized ``torch.distributed`` group, else torchrun's ``RANK`` /
``WORLD_SIZE``) where that is unambiguous and refuses where it is not; the completed options
are explicit, so a loader worker or side process that has no process group reads the same
share as the trainer that settled them.

What the world decides (W ranks, this one rank r):

- no layout option: a `ConfigError` (every rank would read the same data); the layout is not
  guessed, because tensor-parallel peers must share data. ``options(dp_degree=1)`` says on
  purpose that every rank reads everything.
- ``dp_degree=W`` without ``dp_group_id``: group r. ``dp_degree`` of fewer groups than ranks
  without ``dp_group_id``: a `ConfigError` (which ranks are peers depends on how the job orders
  its parallel dimensions).
- ``world_size=W`` with a ``global_rank`` other than r: a `ConfigError` (an unset
  ``global_rank`` is 0 on every rank). A ``world_size`` other than W is the job's own
  data-parallel world (Megatron's) and is kept.

Without a world (one process), ``dp_degree`` > 1 without a group reads group 0's share, as in
Zephon; `unsettled_share` says so, for a warning.

Example:
    >>> from zephon_columnar.options import RuntimeOptions
    >>> o = settle_layout(RuntimeOptions(dp_degree=4), ProcessWorld(size=4, rank=2, source="torch.distributed"))
    >>> (o.dp_degree, o.dp_group_id)
    (4, 2)
    >>> settle_layout(RuntimeOptions(dp_degree=2), ProcessWorld(size=4, rank=2, source="torch.distributed"))
    Traceback (most recent call last):
    ...
    zephon_columnar.errors.ConfigError: options(dp_degree=2) without dp_group_id under ...
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from typing import Literal

from zephon_columnar.errors import ConfigError
from zephon_columnar.options import RuntimeOptions


@dataclass(frozen=True, kw_only=True)
class ProcessWorld:
    """The launcher's world this process belongs to: ``size`` ranks, this one ``rank``."""

    size: int
    rank: int
    source: Literal["torch.distributed", "environment"]

    def describe(self) -> str:
        where = "torch.distributed" if self.source == "torch.distributed" else "RANK/WORLD_SIZE"
        return f"{where}'s {self.size} ranks (this is rank {self.rank})"


def current_world() -> ProcessWorld | None:
    """An initialized ``torch.distributed`` group of more than one rank, else the ``RANK`` and
    ``WORLD_SIZE`` a launcher (torchrun) set, else None. Never imports torch."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            size, rank = int(dist.get_world_size()), int(dist.get_rank())
            return ProcessWorld(size=size, rank=rank, source="torch.distributed") if size > 1 else None
    except Exception:  # noqa: BLE001, S110 - a half-torn-down group: fall back to the environment
        pass
    try:
        size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    except (KeyError, ValueError):
        return None
    return ProcessWorld(size=size, rank=rank, source="environment") if size > 1 and 0 <= rank < size else None


def unsettled_share(options: RuntimeOptions) -> str | None:
    """What to warn about when no world decides the layout and ``options`` name several
    data-parallel groups but not this process's: it reads group 0's share (as in Zephon)."""
    o = options
    if o.dp_degree is not None and o.dp_degree > 1 and o.dp_group_id is None and o.world_size == 1:
        return (
            f"options(dp_degree={o.dp_degree}) without dp_group_id (or world_size/global_rank): this process "
            f"reads data-parallel group 0's share of {o.dp_degree}. Pass dp_group_id=<this process's "
            "data-parallel rank> in each process."
        )
    return None


def settle_layout(options: RuntimeOptions, world: ProcessWorld | None) -> RuntimeOptions:
    """``options`` with the data-parallel layout explicit (``dp_degree`` and ``dp_group_id``
    set where ``world`` decides them), or a `ConfigError` where reading on would give two
    data-parallel groups the same data. Settling settled options changes nothing."""
    o = options
    if world is None:
        return o
    if o.world_size > 1:
        if o.world_size == world.size and o.global_rank != world.rank:
            raise ConfigError(
                f"options(world_size={o.world_size}, global_rank={o.global_rank}) under {world.describe()}: "
                f"global_rank is not this rank (an unset global_rank is 0 on every rank, so ranks would read the "
                f"same data). Pass global_rank=torch.distributed.get_rank() ({world.rank} here)."
            )
        return o
    if o.dp_degree is None and o.dp_group_id is None:
        raise ConfigError(
            f"this pipeline has no data-parallel options under {world.describe()}, so every rank would read "
            f"the same batches. Pass options(world_size={world.size}, global_rank=torch.distributed.get_rank()) "
            "when each rank is its own data-parallel group, options(dp_degree=..., dp_group_id=...) when ranks "
            "are grouped (tensor-parallel peers share a group), or options(dp_degree=1) to read the same data "
            "on every rank on purpose."
        )
    if o.dp_group_id is not None or o.dp_degree == 1:
        return o
    if o.dp_degree == world.size:
        return dataclasses.replace(o, dp_group_id=world.rank)
    raise ConfigError(
        f"options(dp_degree={o.dp_degree}) without dp_group_id under {world.describe()}: which ranks share a "
        "data-parallel group depends on how the job orders its parallel dimensions, so the group is not "
        "guessed. Pass dp_group_id=<this rank's data-parallel rank> (TorchTitan: the 'dp' mesh dimension's "
        "get_local_rank(); Megatron: parallel_state.get_data_parallel_rank())."
    )
