"""A mixture that changes during training: a warm-up / main / anneal schedule, then online
reweighting by the training loop, checkpointed and resumed mid-way, exactly.

1. ``ScheduledMixtureWorkSource`` with three phases (by global chunk): warm-up on web, a linear
   ramp into the main mix, an anneal on the high-quality set.
2. A training loop that reweights every 10 steps of the main phase from a per-domain signal (here a made-up,
   deterministic "loss"), with ``pipe.set_mixture(weights)``; the call says from which chunk the
   new weights govern.
3. The job is interrupted at step 25 and resumed from its checkpoint: the resumed loop (which
   calls ``set_mixture`` at the same steps, as the same training code would) trains on exactly
   the batches of the uninterrupted run.
"""

from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa

import zephon_columnar as zephon

DOMAINS = ("web", "code", "quality")
SCHEDULE = [
    zephon.SchedulePoint(at=0, weights={"web": 1.0}),  # warm-up: web only, chunks 0-7
    zephon.SchedulePoint(at=8, weights={"web": 1.0}),
    zephon.SchedulePoint(at=16, weights={"web": 0.6, "code": 0.3, "quality": 0.1}, ramp="linear"),  # ramp in
    zephon.SchedulePoint(at=120, weights={"quality": 0.7, "web": 0.3}),  # anneal
]


def build() -> zephon.Pipeline:
    datasets = [
        zephon.Dataset.from_tables(name, [pa.table({"doc": [f"{name}-{s}-{i}" for i in range(400)]}) for s in range(3)])
        for name in DOMAINS
    ]
    ws = zephon.ScheduledMixtureWorkSource(
        datasets, SCHEDULE, chunk_size=32, seed=7, shuffle_within_shard=True, exhausted_policy="repeat",
        stop_after_passes=None,
    )
    return zephon.Pipeline(ws).shuffle(64, seed=3).batch(16).options(flush_every_k_chunks=2)


def reweight(step: int, seen: Counter[str]) -> dict[str, float]:
    """A stand-in for DoReMi-style online mixing: domains seen less get more weight."""
    total = sum(seen.values())
    return {d: 1.0 + 2.0 * (1 - seen[d] / total) for d in DOMAINS}


def train(pipe: zephon.Pipeline, steps: range, seen: Counter[str], stop_at: int | None = None) -> tuple[list, dict]:
    """The loop: reweights every 10 steps from step 30 (the main phase); returns the docs of each step (and a checkpoint
    taken before step ``stop_at``, where it stops)."""
    batches, ckpt = [], {}
    it = iter(pipe)
    for step in steps:
        if step == stop_at:
            ckpt = {"step": step, "pipeline": pipe.checkpoint(), "seen": dict(seen)}
            break
        if step >= 30 and step % 10 == 0:
            change = pipe.set_mixture(reweight(step, seen))
            print(f"step {step}: reweighted to {change.weights}, from chunk {change.at}")
        docs = next(it).table["doc"].to_pylist()
        seen.update(doc.split("-")[0] for doc in docs)
        batches.append(docs)
    it.close()
    return batches, ckpt


def main() -> None:
    uninterrupted, _ = train(build(), range(60), Counter())
    head, ckpt = train(build(), range(60), Counter(), stop_at=25)
    ckpt = json.loads(json.dumps(ckpt))  # as if written to disk
    resumed_pipe = build()
    resumed_pipe.restore(ckpt["pipeline"])
    tail, _ = train(resumed_pipe, range(ckpt["step"], 60), Counter(ckpt["seen"]))
    assert head + tail == uninterrupted, "the resumed run trains on other batches"
    warmup = Counter(doc.split("-")[0] for docs in uninterrupted[:10] for doc in docs)
    assert set(warmup) == {"web"}, warmup
    print(f"warm-up batches: {dict(warmup)}; after reweighting: "
          f"{dict(Counter(doc.split('-')[0] for docs in uninterrupted[40:] for doc in docs))}")
    print("resumed at step 25: identical to the uninterrupted run:", head + tail == uninterrupted)


if __name__ == "__main__":
    main()
