"""The doctests' shared namespace: a small real environment built once per session, offline.

Every doctest in the package runs with its working directory set to a temporary folder that
holds:

- ``data/web``: 2 Parquet files (row groups of 8) of 16 rows each, columns ``id`` and ``text``;
- ``data/chat``: 2 JSONL files of 4 conversations each, columns ``id`` and ``messages``;
- ``data/wiki_train``: a Hugging Face ``save_to_disk`` folder (2 Arrow shards), column ``text``;
- ``tok/``: a byte-level BPE tokenizer trained here on that text (``tokenizer.json``, with
  ``<s>``, ``</s>``, ``<pad>``, ``<|im_start|>``, ``<|im_end|>`` as ids 0..4) and its
  ``tokenizer_config.json`` (BOS/EOS/PAD names and a ChatML ``chat_template``);
- ``chat.jinja``: that ChatML template with generation tags;

plus ``memory://corpus/chat`` (the JSONL files again, in fsspec's in-process memory filesystem).

Names every doctest sees: ``np``, ``pa``, ``pl``, ``torch``, ``Dataset``, ``Pipeline``,
``StaticMixtureWorkSource``, ``tok_path`` (``"tok/tokenizer.json"``), ``tok`` (that
``tokenizers.Tokenizer``), ``ds`` (``Dataset.from_path("web", "data/web")``), ``ws`` (a
``StaticMixtureWorkSource`` over ``ds``, ``chunk_size=16``), ``pipe`` (``Pipeline(ws)``) and
``batch`` (the first `SampleBatch` of ``pipe`` tokenized with an EOS per document, packed into
rows of 65 tokens and batched by 4). ``ws``, ``pipe`` and ``batch`` are built afresh for every
doctest (builder methods change a pipeline in place). Ordinary tests are not affected: this
runs only for doctest items.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _pytest.doctest import DoctestItem

WEB_TEXTS = (
    "The river carried the fishing boats downstream long before the evening storm reached the hills.",
    "Bread rises faster in a warm kitchen, so bakers start the dough before sunrise.",
    "A lighthouse keeper once logged every passing ship by hand in a leather notebook.",
    "Most deserts are cold at night because dry air holds very little of the day's heat.",
    "The library reopened on Monday with longer hours and a new reading room for children.",
    "Honeybees communicate the direction of flowers with a short dance on the honeycomb.",
    "Our train left the station twelve minutes late, but it arrived in the city on time.",
    "Volcanic soil is rich in minerals, which is why vineyards often grow on old lava slopes.",
    "She repaired the bicycle chain with a borrowed tool and rode to the market.",
    "Mountain weather changes quickly: pack a warm layer even when the morning is clear.",
    "The committee will publish its report after the public consultation closes in May.",
    "Octopuses can squeeze through any gap larger than their beak, the only hard part of their body.",
    "Rain fell all night, and by morning the small creek had become a muddy river.",
    "A good index lets a database find one row among millions without reading the whole table.",
    "The old bridge was closed for repairs, so traffic crossed the river further north.",
    "Astronomers measured the distance to the star by watching it shift against the background.",
    "He planted tomatoes along the fence where they would get the afternoon sun.",
    "The museum's new exhibition traces the history of printing from woodblocks to lasers.",
    "Salt was once so valuable that soldiers were sometimes paid with it.",
    "The recipe calls for two eggs, a cup of flour and a pinch of salt.",
    "Wind turbines turn slowly, yet the tips of their blades move faster than a car on a highway.",
    "The village held its first market of the season in the square beside the church.",
    "Penguins cannot fly, but they swim with remarkable speed using their wings as flippers.",
    "A compiler translates source code into instructions that the processor can execute.",
    "The forest was quiet except for the distant tapping of a woodpecker.",
    "Glaciers move only a few meters a year, carving valleys over thousands of years.",
    "The team celebrated the release with coffee and a cake shaped like a server rack.",
    "Tides are caused mainly by the moon's gravity pulling on the oceans.",
    "Every checkpoint records where the loader stopped, so training resumes without repeating data.",
    "The children built a snowman with a carrot nose and two buttons for eyes.",
    "Paper was invented in China and reached Europe more than a thousand years later.",
    "The storm knocked out power to the island for two days.",
)

CHATS = (
    [("user", "What is the capital of France?"), ("assistant", "The capital of France is Paris.")],
    [("user", "Give me a synonym for happy."), ("assistant", "Cheerful.")],
    [("system", "Answer briefly."), ("user", "How many legs does a spider have?"), ("assistant", "Eight.")],
    [("user", "Translate 'good morning' into Spanish."), ("assistant", "Buenos días.")],
    [("user", "Is a tomato a fruit?"), ("assistant", "Yes, botanically it is a fruit.")],
    [("user", "Name a primary color."), ("assistant", "Blue."), ("user", "Another one?"), ("assistant", "Red.")],
    [("user", "What does a thermometer measure?"), ("assistant", "Temperature.")],
    [("user", "Which planet is closest to the sun?"), ("assistant", "Mercury is the closest planet to the sun.")],
)

#: ChatML, the assistant's content and its <|im_end|> in a generation block (supervised).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}"
    "{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}{{ '\n' }}"
    "{% else %}"
    "{{ m['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]


def _train_tokenizer(texts: list[str]) -> Any:
    """A byte-level BPE tokenizer trained in a fraction of a second (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def _write_files(root: Path) -> None:
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    web = root / "data" / "web"
    web.mkdir(parents=True)
    for s in range(2):
        ids = list(range(16 * s, 16 * (s + 1)))
        table = pa.table({"id": pa.array(ids, pa.int64()), "text": [WEB_TEXTS[i] for i in ids]})
        pq.write_table(table, web / f"part-{s:03d}.parquet", row_group_size=8)

    chat = root / "data" / "chat"
    chat.mkdir(parents=True)
    memory = fsspec.filesystem("memory")
    for s in range(2):
        lines = [
            json.dumps({"id": i, "messages": [{"role": r, "content": c} for r, c in CHATS[i]]}) + "\n"
            for i in range(4 * s, 4 * (s + 1))
        ]
        (chat / f"part-{s:03d}.jsonl").write_text("".join(lines))
        memory.pipe_file(f"/corpus/chat/part-{s:03d}.jsonl", "".join(lines).encode())

    wiki = root / "data" / "wiki_train"  # what datasets.Dataset.save_to_disk writes, by hand
    wiki.mkdir(parents=True)
    names = [f"data-{s:05d}-of-00002.arrow" for s in range(2)]
    for s, name in enumerate(names):
        table = pa.table({"text": list(WEB_TEXTS[8 * s : 8 * (s + 1)])})
        with pa.OSFile(str(wiki / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    (wiki / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names], "_split": "train"}))
    (wiki / "dataset_info.json").write_text(json.dumps({"features": {"text": {"dtype": "string", "_type": "Value"}}}))

    texts = list(WEB_TEXTS) + [c for conv in CHATS for _, c in conv]
    (root / "tok").mkdir()
    _train_tokenizer(texts).save(str(root / "tok" / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "chat_template": CHAT_TEMPLATE}
    (root / "tok" / "tokenizer_config.json").write_text(json.dumps(config))
    (root / "chat.jinja").write_text(CHAT_TEMPLATE)


@pytest.fixture(scope="session")
def _doctest_home(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The doctests' folder (files written once) and the names that do not change."""
    import fsspec
    import numpy as np
    import polars as pl
    import pyarrow as pa
    import torch
    from tokenizers import Tokenizer

    from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource

    root = tmp_path_factory.mktemp("doctest_home")
    _write_files(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("ZEPHON_COLUMNAR_CACHE", str(root / ".cache"))
        names = {
            "np": np,
            "pa": pa,
            "pl": pl,
            "torch": torch,
            "Dataset": Dataset,
            "Pipeline": Pipeline,
            "StaticMixtureWorkSource": StaticMixtureWorkSource,
            "tok_path": "tok/tokenizer.json",
            "tok": Tokenizer.from_file(str(root / "tok" / "tokenizer.json")),
            "ds": Dataset.from_path("web", "data/web"),
        }
    yield root, names
    memory = fsspec.filesystem("memory")
    if memory.exists("/corpus"):
        memory.rm("/corpus", recursive=True)


@pytest.fixture(autouse=True)
def _doctest_namespace(request: pytest.FixtureRequest) -> Any:
    """For doctest items only: cwd in the doctests' folder, a private cache, fresh ``ws`` /
    ``pipe`` / ``batch`` in ``doctest_namespace``."""
    if not isinstance(request.node, DoctestItem):
        yield
        return
    from zephon_columnar.io import fs

    root, names = request.getfixturevalue("_doctest_home")
    monkeypatch = request.getfixturevalue("monkeypatch")
    monkeypatch.chdir(root)
    monkeypatch.setenv("ZEPHON_COLUMNAR_CACHE", str(root / ".cache"))
    monkeypatch.setattr(fs, "_default_cache", fs._default_cache)  # noqa: SLF001 - an example may repoint it
    namespace = request.getfixturevalue("doctest_namespace")
    namespace.update(names)
    Pipeline, StaticMixtureWorkSource = names["Pipeline"], names["StaticMixtureWorkSource"]
    namespace["ws"] = StaticMixtureWorkSource([names["ds"]], {"web": 1.0}, chunk_size=16, seed=0)
    namespace["pipe"] = Pipeline(namespace["ws"])
    packed = (
        Pipeline(StaticMixtureWorkSource([names["ds"]], {"web": 1.0}, chunk_size=16, seed=0))
        .tokenize(tokenizer_id="tok/", field="text", special_tokens="eos")
        .pack_flat(65, algorithm="wrap")
        .batch(4)
    )
    it = iter(packed)
    namespace["batch"] = next(it)
    it.close()
    yield


#: Optional libraries an example may import, and the extra that installs each.
_EXTRA_OF = {"datasets": "hf", "ray": "ray", "s3fs": "s3"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip an example that imports an optional library that is not installed (a core install),
    naming the extra; under ``ZC_REQUIRE_EXTRAS=1`` (``make test``, CI) it runs and fails instead
    (`tests/extras.py`)."""
    import importlib.util
    import os
    import re

    if os.environ.get("ZC_REQUIRE_EXTRAS") == "1":
        return
    missing = {m: extra for m, extra in _EXTRA_OF.items() if importlib.util.find_spec(m) is None}
    if not missing:
        return
    imports = re.compile(r"^\s*(?:import|from)\s+(" + "|".join(map(re.escape, missing)) + r")\b", re.M)
    for item in items:
        if isinstance(item, DoctestItem) and item.dtest is not None:
            found = imports.search("\n".join(ex.source for ex in item.dtest.examples))
            if found:
                extra = missing[found.group(1)]
                reason = f"needs the {extra} extra: pip install 'zephon_columnar[{extra}]'"
                item.add_marker(pytest.mark.skip(reason=reason))
