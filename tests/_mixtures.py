"""Pipelines over a scheduled mixture, shared by the tests of schedules and of `set_mixture`
(and built again by name in the processes those tests spawn)."""

from __future__ import annotations

import pyarrow as pa

from tests.ops._tokenizers import make_texts, make_tokenizer
from zephon_columnar import Dataset, ScheduledMixtureWorkSource, SchedulePoint

TOKENIZER = make_tokenizer()
NAMES = ("web", "code", "math")
DATASETS = [
    Dataset.from_tables(n, [pa.table({"text": make_texts(60, seed=i * 2 + s, max_words=10)}) for s in range(2)])
    for i, n in enumerate(NAMES)
]
#: warm-up on web (chunks 0-3), a linear ramp into the main mix (reached at chunk 6), an anneal
#: on math from chunk 9 (by global chunk)
SCHEDULE = [
    SchedulePoint(at=0, weights={"web": 1.0}),
    SchedulePoint(at=3, weights={"web": 1.0}),
    SchedulePoint(at=6, weights={"web": 0.5, "code": 0.3, "math": 0.2}, ramp="linear"),
    SchedulePoint(at=9, weights={"math": 1.0}),
]


def source(datasets=None, **kw) -> ScheduledMixtureWorkSource:
    """The mixture of ``datasets`` (default `DATASETS`) under `SCHEDULE`, every dataset read twice."""
    kw = {"chunk_size": 10, "seed": 5, "shuffle_within_shard": True, "exhausted_policy": "repeat", "max_repeats": 1, **kw}
    return ScheduledMixtureWorkSource(DATASETS if datasets is None else datasets, SCHEDULE, **kw)


#: bigger datasets of ints, for a stateless plan: its flush epoch is a frame's worth of rows
#: (4,096 here, 8 chunks of 512), the granularity of a change
LARGE = [
    Dataset.from_tables(n, [pa.table({"x": list(range(i * 10**6, i * 10**6 + 6000))})]) for i, n in enumerate(NAMES)
]


def large_source(**kw) -> ScheduledMixtureWorkSource:
    return source(LARGE, **{"chunk_size": 512, **kw})


def token_source(**kw) -> ScheduledMixtureWorkSource:
    """`source` with token-unit weights (the pipeline primes the tokens per byte by tokenizing)."""
    from zephon_columnar.work import TokenEstimation

    return source(token_estimation=TokenEstimation(calibration_samples=20), **kw)


PLANS = {
    "rows": lambda p: p.batch(3),
    "shuffle": lambda p: p.shuffle(7, seed=1).batch(2),
    "tokens-packed": lambda p: (
        p.tokenize(TOKENIZER, field="text", special_tokens="eos")
        .shuffle(5, seed=2)
        .pack_flat(24, algorithm="wrap", pad_token_id=0)
        .batch(2)
    ),
    # ensure_mixture holds each chunk to its target: the schedule's weights of that chunk
    "ensured": lambda p: p.tokenize(TOKENIZER, field="text").ensure_mixture(max_buffer_size=40).batch(2),
}
