"""Token-unit mixtures end to end: a `Pipeline` primes its work source with its own tokenizer
(replaying the transforms before it), the long-run token share follows the weights, and a
checkpoint carries the ratios so a restored run neither measures again nor mixes differently."""

from __future__ import annotations

import collections
import functools
import json
import os
import pickle
import random
import tempfile
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zephon_columnar as zephon
from zephon_columnar.work import TokenEstimation
from tests.ops._tokenizers import make_texts, make_tokenizer, save_folder

#: words per document of each component: very different lengths
LENGTHS = {"short": 8, "long": 240, "mid": 50}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tokmix")
    for k, (name, words) in enumerate(LENGTHS.items()):
        (root / name).mkdir()
        rng = random.Random(k)
        for s in range(3):
            texts = [make_texts(2, seed=rng.randrange(1 << 30), max_words=words)[1] for _ in range(200)]
            pq.write_table(pa.table({"text": texts}), root / name / f"part-{s}.parquet", row_group_size=64)
    save_folder(root / "tok", make_tokenizer())
    return root


def pipeline(corpus: Path, weights: dict[str, float], *, estimation: TokenEstimation | None = TokenEstimation(),
             before=lambda p: p, runner: str = "inline") -> zephon.Pipeline:
    datasets = [zephon.Dataset.from_path(name=n, path=str(corpus / n)) for n in weights]
    ws = zephon.StaticMixtureWorkSource(datasets=datasets, mixture=zephon.MixtureSpec(weights), chunk_size=32,
                                        seed=5, exhausted_policy="repeat", token_estimation=estimation)
    p = before(zephon.Pipeline(ws))
    return (p.tokenize(tokenizer_id=str(corpus / "tok"), field="text", add_attention_mask=False)
            .pack_flat(max_length=129, algorithm="wrap", emit_positions=True).batch(4).options(runner=runner))


def token_share(p: zephon.Pipeline, batches: int) -> dict[str, float]:
    totals: collections.Counter = collections.Counter()
    it = iter(p)
    for _, batch in zip(range(batches), it):
        for r in batch.records:
            assert sum(r.meta.component_token_counts.values()) == len(r.payload["input_ids"])  # every token
            totals.update(r.meta.component_token_counts)
    it.close()
    ids = p._ws.component_ids()  # noqa: SLF001
    total = sum(totals.values())
    return {name: totals[ids[name]] / total for name in ids}


def test_long_run_token_share_matches_the_weights_on_a_skewed_corpus(corpus):
    weights = {"short": 0.5, "long": 0.2, "mid": 0.3}
    share = token_share(pipeline(corpus, weights), 1500)  # ~770k tokens
    for name, w in weights.items():
        assert share[name] == pytest.approx(w, rel=0.02), share
    # the same weights as sample proportions give a very different token share
    assert token_share(pipeline(corpus, weights, estimation=None), 300)["short"] < 0.1


def test_priming_replays_the_transforms_before_the_tokenizer(corpus):
    def ratios(before):
        p = pipeline(corpus, {"short": 0.5, "long": 0.5}, before=before)
        next(iter(p)).records  # noqa: B018 - priming happens at the first iteration
        return p._ws.tokens_per_byte  # noqa: SLF001

    plain = ratios(lambda p: p)
    doubled = ratios(lambda p: p.map_transform(lambda row: {**row, "text": row["text"] + " " + row["text"]}))
    assert doubled["long"] == pytest.approx(2 * plain["long"], rel=0.03)
    # a filter that drops every short document: its rows count no token, so the fallback is used
    with pytest.warns(UserWarning, match=r"\['short'\]"):
        dropped = ratios(lambda p: p.filter(lambda row: len(row["text"]) > 200))
    assert dropped["short"] == 0.25 and dropped["long"] == pytest.approx(plain["long"], rel=0.05)


def test_measure_counts_payloads_instead_of_the_tokenizer(corpus):
    calls = []

    def words(payload):
        calls.append(1)
        return len(payload["text"].split())

    est = TokenEstimation(measure=words, calibration_samples=90)
    p = pipeline(corpus, {"short": 0.5, "long": 0.5}, estimation=est)
    next(iter(p))
    assert len(calls) == 180  # 90 calibration rows per dataset, nothing else
    by_words = p._ws.tokens_per_byte  # noqa: SLF001
    tokenized = pipeline(corpus, {"short": 0.5, "long": 0.5}, estimation=TokenEstimation(calibration_samples=90))
    next(iter(tokenized))
    by_tokens = tokenized._ws.tokens_per_byte  # noqa: SLF001
    for name in by_words:  # every word is one token or more (and tokenize adds BOS/EOS)
        assert 0 < by_words[name] < by_tokens[name]


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_a_restored_token_mixture_continues_exactly_without_measuring_again(corpus, runner):
    calls = []
    est = TokenEstimation(measure=lambda payload: calls.append(1) or len(payload["text"]), calibration_samples=60)
    weights = {"short": 0.6, "long": 0.4}
    first = pipeline(corpus, weights, estimation=est, runner=runner)
    it = iter(first)
    for _ in range(7):
        next(it)
    saved = first.checkpoint()
    expected = [[r.meta.sample_id for r in next(it).records] for _ in range(12)]
    it.close()
    measured = len(calls)
    for stored in (pickle.loads(pickle.dumps(saved)), json.loads(json.dumps(saved))):
        again = pipeline(corpus, weights, estimation=est, runner=runner)
        again.restore(stored)
        it = iter(again)
        assert [[r.meta.sample_id for r in next(it).records] for _ in range(12)] == expected
        it.close()
        assert len(calls) == measured  # the ratios came from the checkpoint


def test_without_a_tokenizer_or_measure_the_fallback_ratio_is_used_with_a_warning(corpus):
    datasets = [zephon.Dataset.from_path(name=n, path=str(corpus / n)) for n in ("short", "long")]
    ws = zephon.StaticMixtureWorkSource(datasets=datasets, mixture={"short": 1, "long": 1}, chunk_size=16,
                                        token_estimation=TokenEstimation(fallback_tokens_per_byte=0.2))
    with pytest.warns(UserWarning, match="fallback_tokens_per_byte=0.2"):
        next(iter(zephon.Pipeline(ws).batch(2)))
    assert ws.tokens_per_byte == {"short": 0.2, "long": 0.2}


@pytest.mark.parametrize("field", ["input_ids", "tokens", "token_ids"])
def test_pretokenized_data_without_a_tokenizer_is_counted_from_its_token_arrays(tmp_path, field):
    # Rows of 12 and 48 tokens (JSONL, as a pretokenizing job writes them), half the tokens each:
    # the draws take four short rows for every long one, and no fallback ratio is used.
    datasets = []
    for name, length in (("short", 12), ("long", 48)):
        (tmp_path / name).mkdir()
        for s in range(3):
            rows = [json.dumps({field: list(range(length)), "id": f"{name}-{s}-{i}"}) for i in range(100)]
            (tmp_path / name / f"part-{s}.jsonl").write_text("\n".join(rows) + "\n")
        datasets.append(zephon.Dataset.from_path(name=name, path=str(tmp_path / name)))
    ws = zephon.StaticMixtureWorkSource(datasets=datasets, mixture={"short": 0.5, "long": 0.5}, chunk_size=64,
                                        seed=11, token_estimation=TokenEstimation(calibration_samples=24))
    tokens: collections.Counter = collections.Counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="StaticMixtureWorkSource: no tokens counted")  # the fallback
        for batch in zephon.Pipeline(ws).batch(8):
            for r in batch.records:
                tokens[r.meta.sample_id[0]] += len(r.payload[field])
    assert ws.state_dict()["token_ratios"]["short"][1] == "measured"
    assert tokens[0] / sum(tokens.values()) == pytest.approx(0.5, abs=0.03)


# ---------------------------------------------------------------------------- property
@functools.lru_cache(maxsize=None)
def _tokenizer_dir() -> str:
    folder = Path(tempfile.mkdtemp(prefix="zc-tokmix-"))
    save_folder(folder, make_tokenizer())
    return str(folder)


@settings(max_examples=int(os.environ.get("ZC_PROPERTY_EXAMPLES", "20")) // 2, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(weights=st.lists(st.integers(1, 9), min_size=2, max_size=3),
       max_words=st.lists(st.sampled_from([4, 20, 80, 300]), min_size=3, max_size=3),
       shards=st.integers(1, 3), seed=st.integers(0, 1000))
def test_token_share_follows_random_weights_on_random_corpora(weights, max_words, shards, seed):
    names = [f"c{i}" for i in range(len(weights))]
    datasets = [zephon.Dataset.from_tables(name, [
        pa.table({"text": make_texts(120, seed=seed * 31 + 7 * i + s, max_words=max_words[i])[1:]})
        for s in range(shards)]) for i, name in enumerate(names)]
    ws = zephon.StaticMixtureWorkSource(datasets=datasets, mixture=dict(zip(names, map(float, weights))),
                                        chunk_size=16, seed=seed, exhausted_policy="repeat",
                                        token_estimation=TokenEstimation())
    p = (zephon.Pipeline(ws).tokenize(tokenizer_id=_tokenizer_dir(), field="text", add_attention_mask=False)
         .pack_flat(max_length=65, algorithm="wrap").batch(8).options(runner="inline"))
    share = token_share(p, 500)  # ~260k tokens
    total = sum(weights)
    for name, w in zip(names, weights):
        # calibration saw every row, so what is left is the noise of a finite run
        assert share[name] == pytest.approx(w / total, abs=0.025), (share, weights, max_words)
