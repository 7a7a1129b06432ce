"""Lane ownership: which data-parallel group owns which lanes, and which lane serves next.

Lanes (``canonical_replicas`` of them) are the unit of the data order: each lane has its own
work-source clone and its own ordered stream. A data-parallel group owns a subset of lanes;
changing the number of groups changes only which group emits which lane.

Example:
    >>> owned_lanes(canonical_replicas=4, dp_degree=2, dp_group_id=1, mapping="contiguous")
    [2, 3]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from zephon_columnar.errors import ConfigError


def owned_lanes(
    *, canonical_replicas: int, dp_degree: int, dp_group_id: int, mapping: Literal["contiguous", "interleaved"]
) -> list[int]:
    """The lanes group ``dp_group_id`` of ``dp_degree`` owns: a contiguous block (sizes differing
    by at most one) or every ``dp_degree``-th lane (``"interleaved"``)."""
    if canonical_replicas < dp_degree:
        raise ConfigError(
            f"canonical_replicas={canonical_replicas} < dp_degree={dp_degree}: some data-parallel groups "
            "would own no lane. Set options(canonical_replicas=...) to at least the number of groups."
        )
    if not 0 <= dp_group_id < dp_degree:
        raise ConfigError(f"dp_group_id={dp_group_id} is outside 0..{dp_degree - 1} (dp_degree={dp_degree}).")
    if mapping == "interleaved":
        return [lane for lane in range(canonical_replicas) if lane % dp_degree == dp_group_id]
    # Contiguous blocks, sizes differing by at most one.
    base, extra = divmod(canonical_replicas, dp_degree)
    start = dp_group_id * base + min(dp_group_id, extra)
    size = base + (1 if dp_group_id < extra else 0)
    return list(range(start, start + size))


def next_lane(active: Sequence[int], emitted: dict[int, int]) -> int:
    """The lane the tail serves next: fewest items emitted, ties to the earlier lane.

    On an unchanged topology this is plain round robin; after a restore onto another topology
    it first evens out the lanes that fell behind, so global steps stay aligned.
    """
    return min(active, key=lambda lane: (emitted.get(lane, 0), lane))
