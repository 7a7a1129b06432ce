"""The examples of Zephon's guide page on user-defined operators
(``../shared/seeds/user_defined_operators.txt``), each run as written with only its ``zephon``
import lines changed to ``zephon_columnar``.

The guide's snippets use names they do not define (``work_source``, ``embed``, ``classifier``,
``load_classifier``); each test provides them, then runs the pipeline the snippet built and
checks what the guide says it does.
"""

from __future__ import annotations

import re
import textwrap
from collections import Counter

import pyarrow as pa
import pytest

import zephon_columnar
from zephon_columnar import Dataset, StaticMixtureWorkSource
from zephon_columnar.types import SampleBatch

# ---------------------------------------------------------------- the guide's snippets, verbatim
MAP_TRANSFORM_FILTER = '''
"""Strip boilerplate from a document, and drop what is left if it is too short."""

from typing import Any

from zephon import Pipeline


def clean_document(payload: Any) -> dict[str, Any] | None:
    """Remove navigation boilerplate; return None to drop the document."""
    text = payload["text"].replace("Home | About | Contact", "").strip()
    return {**payload, "text": text} if len(text) >= 200 else None


pipeline = Pipeline(work_source).decode_text().map_transform(clean_document)
'''

STATEFUL_TRANSFORM_PAIR = '''
"""Hold a record back until its partner arrives."""

from zephon import Pipeline
from zephon.types import SampleRecord


def pair_up(
    held: dict[str, SampleRecord], records: list[SampleRecord]
) -> tuple[dict[str, SampleRecord], list[SampleRecord]]:
    """Emit a record once the record with its document id has also been seen."""
    emitted = []
    for record in records:
        partner = held.pop(record.payload["doc_id"], None)
        if partner is None:
            held[record.payload["doc_id"]] = record
        else:
            emitted += [partner, record]
    return held, emitted


# push holds records back, so flush has to empty the buffer or those records
# are dropped in silence. Holding a record past a later one reorders the
# stream, hence preserves_cursor_order=False.
pipeline = Pipeline(work_source).stateful_transform(
    "pair_up",
    init_state=dict,
    push=pair_up,
    flush=lambda held: list(held.values()),
    preserves_cursor_order=False,
)
'''

STATEFUL_TRANSFORM_WORKERS = '''
"""Buffer on one thread, do the expensive work on many."""

from zephon import Pipeline
from zephon.types import SampleRecord


def encode(records: list[SampleRecord]) -> list[SampleRecord]:
    """Run on the parallel workers, once per group of records push emitted."""
    for record in records:
        record.payload = {**record.payload, "embedding": embed(record.payload["text"])}
    return records


# push and flush run single-threaded and see every record in order; transform
# is what gets fanned out. State is per lane, created by init_state for each
# one, and reset at every flush.
pipeline = Pipeline(work_source).stateful_transform(
    "pair_and_encode",
    init_state=dict,
    push=pair_up,
    flush=lambda held: list(held.values()),
    transform=encode,
    parallelism=4,
    preserves_cursor_order=False,
)
'''

RECORDS_IN_RECORDS_OUT = '''
"""Return the records you were given, not bare payloads."""

from zephon.types import SampleRecord


def score(records: list[SampleRecord]) -> list[SampleRecord]:
    """Rebuild the payload, and hand back the record that carried it."""
    for record in records:
        record.payload = {**record.payload, "score": len(record.payload["text"])}
    return records


def score_the_wrong_way(records: list[SampleRecord]) -> list[dict[str, object]]:
    """Zephon rejects this: the lineage left behind is what makes replay work."""
    return [{"score": len(record.payload["text"])} for record in records]
'''

ADD_OP_QUALITY_SCORE = '''
"""Attach a function as an operator, with its own grouping."""

from zephon import Pipeline
from zephon.ops import CountingAccumulator
from zephon.types import SampleRecord


def score_documents(records: list[SampleRecord]) -> list[SampleRecord]:
    """Score a whole group of documents in one call of the classifier."""
    scores = classifier([record.payload["text"] for record in records])
    for record, quality in zip(records, scores, strict=True):
        record.payload = {**record.payload, "quality": quality}
    return records


# The accumulator is a factory, not an instance: Zephon rebuilds it on start
# and on every reset. CountingAccumulator buffers per lane, so a group never
# mixes lanes. Scoring only writes the field; a map_transform does the dropping.
pipeline = (
    Pipeline(work_source)
    .add_op(
        "quality_score",
        process_many=score_documents,
        accumulator=lambda: CountingAccumulator(max_batch=64),
        preserves_cursor_order=True,
        parallelism=4,
    )
    .map_transform(lambda payload: payload if payload["quality"] > 0.5 else None)
)
'''

BASEOP_SUBCLASS = '''
"""Subclass BaseOp to load an expensive model once per worker in setup."""

from typing import Any

from zephon.ops import (
    Accumulator,
    BaseOp,
    CountingAccumulator,
    OpContext,
    OpTraits,
)
from zephon.types import SampleRecord


class QualityScoreOp(BaseOp):
    """Score documents with a classifier that is too costly to load per call."""

    def __init__(self, model_name: str) -> None:
        super().__init__()
        self._model_name = model_name  # configuration, and picklable
        self._model = None  # built per worker in setup

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self._model = load_classifier(self._model_name)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, parallelism=4)

    def accumulator(
        self, *, deterministic: bool, ctx: dict[str, Any]
    ) -> Accumulator[Any]:
        return CountingAccumulator(max_batch=64)

    def process_many(self, elems: list[SampleRecord]) -> list[SampleRecord]:
        scores = self._model.score([record.payload["text"] for record in elems])
        for record, quality in zip(elems, scores, strict=True):
            record.payload = {**record.payload, "quality": quality}
        return elems
'''

ADD_OP_INSTANCE = '''
"""Attach an operator class by passing an instance."""

from zephon import Pipeline

pipeline = (
    Pipeline(work_source)
    .decode_text()
    .add_op(QualityScoreOp("quality-classifier-v2"))
    .batch(microbatch_size=32)
)
'''


def run_snippet(source: str, namespace: dict) -> dict:
    """Exec a guide snippet with only its import lines changed (zephon -> zephon_columnar)."""
    changed = re.sub(r"^(from|import) zephon\b", r"\1 zephon_columnar", textwrap.dedent(source), flags=re.M)
    assert changed.count("zephon_columnar") == len(re.findall(r"^(?:from|import) zephon\b", source, flags=re.M))
    exec(compile(changed, "<guide example>", "exec"), namespace)
    return namespace


# ---------------------------------------------------------------- what the snippets need
BOILERPLATE = "Home | About | Contact"


def work_source(rows: list[dict]) -> StaticMixtureWorkSource:
    ds = Dataset.from_tables("docs", [pa.Table.from_pylist(rows)])
    return StaticMixtureWorkSource([ds], {"docs": 1.0}, chunk_size=8, seed=3)


def documents(n: int = 40) -> list[dict]:
    return [{"doc_id": f"d{i // 2}", "text": f"{BOILERPLATE} document {i} " + "word " * (i * 3)} for i in range(n)]


def classifier(texts: list[str]) -> list[float]:
    """A stand-in model: longer documents score higher (deterministic)."""
    return [min(1.0, len(t) / 400) for t in texts]


class _Model:
    def __init__(self, name: str) -> None:
        self.name = name

    def score(self, texts: list[str]) -> list[float]:
        return classifier(texts)


def load_classifier(name: str) -> _Model:
    return _Model(name)


def test_map_transform_filter_strips_boilerplate_and_drops_short_documents():
    ns = run_snippet(MAP_TRANSFORM_FILTER, {"work_source": work_source(documents())})
    texts = [r.payload["text"] for r in ns["pipeline"]]
    expected = [d["text"].replace(BOILERPLATE, "").strip() for d in documents()]
    assert sorted(texts) == sorted(t for t in expected if len(t) >= 200)
    assert texts and all(BOILERPLATE not in t for t in texts)


def test_stateful_transform_pairs_records_by_document_id():
    ns = run_snippet(STATEFUL_TRANSFORM_PAIR, {"work_source": work_source(documents())})
    records = list(ns["pipeline"])
    assert Counter(r.payload["doc_id"] for r in records) == Counter(d["doc_id"] for d in documents())
    # Partners come out next to each other unless a flush point separated them.
    adjacent = sum(a.payload["doc_id"] == b.payload["doc_id"] for a, b in zip(records, records[1:]))
    assert adjacent >= len(records) // 2 - 4


def test_stateful_transform_runs_its_transform_on_the_workers():
    ns = run_snippet(STATEFUL_TRANSFORM_PAIR, {"work_source": work_source(documents())})
    ns.update(work_source=work_source(documents()), embed=lambda text: [len(text), text.count("word")])
    run_snippet(STATEFUL_TRANSFORM_WORKERS, ns)
    records = list(ns["pipeline"].options(runner="threads"))
    assert len(records) == len(documents())
    assert all(r.payload["embedding"] == [len(r.payload["text"]), r.payload["text"].count("word")] for r in records)


def test_records_in_records_out_and_the_wrong_way_is_rejected():
    ns = run_snippet(RECORDS_IN_RECORDS_OUT, {})
    good = zephon_columnar.Pipeline(work_source(documents())).add_op(
        "score", process_many=ns["score"], preserves_cursor_order=True)
    assert all(r.payload["score"] == len(r.payload["text"]) for r in good)
    bad = zephon_columnar.Pipeline(work_source(documents())).add_op(
        "score", process_many=ns["score_the_wrong_way"], preserves_cursor_order=True).options(auto_validation="off")
    with pytest.raises(TypeError, match="SampleRecord"):
        list(bad)


@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_add_op_quality_score_scores_in_groups_and_filters(runner):
    ns = run_snippet(ADD_OP_QUALITY_SCORE, {"work_source": work_source(documents()), "classifier": classifier})
    records = list(ns["pipeline"].options(runner=runner))
    assert sorted(r.payload["text"] for r in records) == sorted(
        d["text"] for d in documents() if classifier([d["text"]])[0] > 0.5)
    assert all(r.payload["quality"] > 0.5 for r in records)


@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_baseop_subclass_passed_as_an_instance(runner):
    ns = run_snippet(BASEOP_SUBCLASS, {"load_classifier": load_classifier})
    ns["work_source"] = work_source(documents())
    run_snippet(ADD_OP_INSTANCE, ns)
    batches = list(ns["pipeline"].options(runner=runner))
    assert all(isinstance(b, SampleBatch) and len(b) == 32 for b in batches)
    rows = [r.payload for b in batches for r in b.records]
    assert len(rows) == 32 * (len(documents()) // 32)
    assert all(r["quality"] == classifier([r["text"]])[0] for r in rows)
