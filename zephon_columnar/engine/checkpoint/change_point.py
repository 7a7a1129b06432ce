"""Where a change of the mixture asked for now takes effect: the first global chunk nothing
delivered depends on, the same whatever the runner, prefetch depth, side process or timing.

A pipeline whose mixture may change is checkpointed by replay (`mode`): each lane's state is a
`LaneCursor`, the flush epoch of its last delivered item replayed from that epoch's first chunk,
so the delivered stream and a restart from the cursors read nothing past that epoch. A lane
reads one chunk per block of ``canonical_replicas`` global chunks (its j-th chunk lies in block
j, whichever lane assignment), so epoch ``e`` of every lane ends before global chunk
``(e + 1) * flush_every * canonical_replicas``. The change point is that bound for the lane
furthest on; a lane that delivered nothing yet, still at the stream's start, needs nothing.

Ranks compare what they were asked (`agree`): a change that two ranks disagree on is an error,
not two data orders.

Example:
    >>> cursor = LaneCursor(epoch=2, rows=5, items=9, inputs=0, source_state={}, carries={}, exhausted=frozenset())
    >>> change_point({0: cursor}, flush_every=4, replicas=2)   # (2 + 1) * 4 * 2
    24
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from zephon_columnar.engine.checkpoint.state import LaneCursor, LaneState
from zephon_columnar.errors import CheckpointError


def change_point(lanes: Mapping[int, LaneState], *, flush_every: int, replicas: int) -> int:
    """The first global chunk none of ``lanes``' delivered items (nor a restart from their
    states) depends on (see the module docstring)."""
    point = 0
    for lane, state in lanes.items():
        if not isinstance(state, LaneCursor):
            raise CheckpointError(
                f"lane {lane}: a snapshot by reference where a mixture change needs a replay cursor; the pipeline "
                "was restored from a checkpoint of a pipeline whose mixture cannot change. Restore a checkpoint of "
                "this pipeline, or start it from scratch."
            )
        if state.items or state.epoch:
            point = max(point, (state.epoch + 1) * flush_every * replicas)
    return point


def agree(weights: Mapping[str, Fraction], point: int, *, rank: int | None) -> int:
    """The change point every rank of the ``torch.distributed`` group agrees on: the furthest
    of theirs, once all were asked the same ``weights`` (a `RuntimeError` naming the ranks and
    their weights otherwise). ``rank``: this process's, for the message."""
    import torch.distributed as dist

    asked: dict[str, Any] = {"weights": sorted((n, str(w)) for n, w in weights.items() if w), "point": point}
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, asked)
    mine = asked["weights"]
    differ = {r: dict(p["weights"]) for r, p in enumerate(parts) if p["weights"] != mine}
    if differ:
        raise RuntimeError(
            f"set_mixture(): the ranks were asked different mixtures (rank {rank}: {dict(mine)}; "
            + "; ".join(f"rank {r}: {w}" for r, w in sorted(differ.items()))
            + "). Every data-parallel rank must call set_mixture with the same weights at the same step, or the "
            "ranks would read different data orders; compute the weights on one rank and broadcast them first."
        )
    return max(int(p["point"]) for p in parts)
