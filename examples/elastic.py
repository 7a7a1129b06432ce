"""Elastic resume: 2 data-parallel groups take a checkpoint, 4 groups continue from it.

Each group is simulated in this process with options(world_size=..., global_rank=...), takes its
own lanes' checkpoint (checkpoint(collective=False)) and the parts are merged here; in a real job
each rank builds the same pipeline with its own rank and calls checkpoint() collectively (merged
through options(aggregate_dir=...) or torch.distributed).
"""

from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa

import zephon_columnar as zephon


def build(groups: int, rank: int) -> zephon.Pipeline:
    ds = zephon.Dataset.from_tables("nums", [pa.table({"n": list(range(s * 100, s * 100 + 100))}) for s in range(4)])
    ws = zephon.StaticMixtureWorkSource([ds], {"nums": 1.0}, chunk_size=16, seed=1, shuffle_within_shard=True)
    return zephon.Pipeline(ws).batch(4).options(canonical_replicas=4, world_size=groups, global_rank=rank)


def rows(batches) -> list[int]:
    return [n for b in batches for n in b.to_pydict()["n"]]


def main() -> None:
    delivered, parts = [], []
    for rank in range(2):  # two groups, 5 batches each
        pipe = build(2, rank)
        it = iter(pipe)
        delivered += rows(next(it) for _ in range(5))
        parts.append(json.loads(json.dumps(pipe.checkpoint(collective=False))))  # this group's lanes
        it.close()
    merged = zephon.Pipeline.merge_checkpoints(parts)
    rest = []
    for rank in range(4):  # four groups continue
        pipe = build(4, rank)
        pipe.restore(merged)
        rest += rows(pipe)
    total = Counter(delivered) + Counter(rest)
    assert set(total.values()) == {1} and len(total) == 400, "every row exactly once"
    print(f"2 groups delivered {len(delivered)} rows, 4 groups delivered the other {len(rest)}: "
          "every row exactly once")


if __name__ == "__main__":
    main()
