"""load_tokenizer: every offline form gives the same ids; special tokens are found or reported;
hub ids fail at once without downloading; handles pickle cheaply and build once."""

from __future__ import annotations

import pickle
import shutil
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ops._tokenizers import (
    CallableTokenizer,
    FakeFastTokenizer,
    count_builds,
    make_texts,
    make_tokenizer,
    reference_ids,
    save_folder,
)
from zephon_columnar.errors import ConfigError
from zephon_columnar.ops.tokenize.load import load_tokenizer, path_identity

TEXTS = make_texts(40, seed=3)


def rows(flat: np.ndarray, offsets: np.ndarray) -> list[list[int]]:
    assert flat.dtype == np.int32 and offsets.dtype == np.int64 and offsets[0] == 0
    return [flat[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tok):
    return save_folder(tmp_path_factory.mktemp("tok"), tok,
                       config={"bos_token": {"content": "<s>", "special": True}, "eos_token": "</s>",
                               "pad_token": "<pad>", "tokenizer_class": "PreTrainedTokenizerFast"})


def all_forms(tok, folder):
    return {
        "object": dict(tokenizer=tok),
        "file": dict(tokenizer_id=str(folder / "tokenizer.json")),
        "folder": dict(tokenizer_id=str(folder)),
        "folder-pathlike": dict(tokenizer_id=folder),
        "path-as-tokenizer": dict(tokenizer=str(folder)),
        "hf-fast": dict(tokenizer=FakeFastTokenizer(make_tokenizer())),
        "callable": dict(tokenizer=CallableTokenizer(make_tokenizer())),
    }


def test_every_form_gives_the_same_ids_and_specials(tok, folder):
    expected = reference_ids(tok, TEXTS)
    for name, kw in all_forms(tok, folder).items():
        h = load_tokenizer(**kw)
        assert rows(*h.encode_ids(TEXTS)) == expected, name
        assert (h.bos_token_id, h.eos_token_id, h.pad_token_id) == (0, 1, 2), name


@settings(max_examples=30, deadline=None)
@given(texts=st.lists(st.text(max_size=40), max_size=12))
def test_encode_ids_equals_encode_batch(tok, texts):
    h = load_tokenizer(tok)
    assert rows(*h.encode_ids(texts)) == reference_ids(tok, texts)


def test_truncate_to_cuts_rows(tok):
    h = load_tokenizer(tok)
    got = rows(*h.encode_ids(TEXTS, truncate_to=5))
    assert got == [r[:5] for r in reference_ids(tok, TEXTS)]
    assert rows(*h.encode_ids(TEXTS)) == reference_ids(tok, TEXTS)  # truncation switched back off
    c = load_tokenizer(CallableTokenizer(make_tokenizer()))
    assert rows(*c.encode_ids(TEXTS, truncate_to=5)) == got


def test_the_users_tokenizer_is_not_mutated_and_its_padding_is_ignored():
    user = make_tokenizer()
    user.enable_padding(pad_id=2, pad_token="<pad>")  # would pad to the longest text of each call
    h = load_tokenizer(user)
    got = rows(*h.encode_ids(TEXTS, truncate_to=7))
    assert got == [r[:7] for r in reference_ids(make_tokenizer(), TEXTS)]
    assert user.padding is not None and user.truncation is None


@pytest.mark.parametrize("bad", ["gpt2", "meta-llama/Llama-3.2-1B", "s3://bucket/tokenizer"])  # paths: test_bad_input
def test_hub_id_fails_at_once_and_says_no_download(bad):
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        load_tokenizer(tokenizer_id=bad)
    assert time.perf_counter() - t0 < 1.0
    msg = str(info.value)
    assert repr(bad) in msg and "never downloads" in msg and "tokenizer_id=" in msg


def test_neither_or_both_or_unsupported(tok, folder):
    with pytest.raises(ConfigError, match=r"tokenizer=.*tokenizer_id="):
        load_tokenizer()
    with pytest.raises(ConfigError, match="not both"):
        load_tokenizer(tok, str(folder))
    with pytest.raises(ConfigError, match="got a int"):
        load_tokenizer(42)


def test_folder_without_tokenizer_json(tmp_path):
    (tmp_path / "vocab.json").write_text("{}")
    with pytest.raises(ConfigError, match="no tokenizer.json.*vocab.json"):
        load_tokenizer(tokenizer_id=str(tmp_path))


def test_not_a_tokenizer_file(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not a tokenizers JSON"):
        load_tokenizer(tokenizer_id=str(bad))


def test_bare_tokenizer_heuristics():
    gpt = load_tokenizer(make_tokenizer(("<|endoftext|>",)))
    assert gpt.bos_token_id == gpt.eos_token_id == 0 and gpt.pad_token_id is None
    llama = load_tokenizer(make_tokenizer(("<|begin_of_text|>", "<|end_of_text|>", "<|pad|>")))
    assert (llama.bos_token_id, llama.eos_token_id, llama.pad_token_id) == (0, 1, 2)
    bert = load_tokenizer(make_tokenizer(("[PAD]", "[CLS]", "[SEP]")))
    assert (bert.bos_token_id, bert.eos_token_id, bert.pad_token_id) == (1, 2, 0)
    none = load_tokenizer(make_tokenizer(("<unk>",)))
    assert (none.bos_token_id, none.eos_token_id, none.pad_token_id) == (None, None, None)
    padded = make_tokenizer(("<unk>",))
    padded.enable_padding(pad_id=0, pad_token="<unk>")
    assert load_tokenizer(padded).pad_token_id == 0  # the padding configured in tokenizer.json


def test_folder_config_wins_over_heuristics_and_map_wins_over_config(tmp_path, tok):
    # tokenizer_config.json says EOS is <pad> (odd but explicit) and there is no BOS (null)
    a = save_folder(tmp_path / "a", tok, config={"bos_token": None, "eos_token": {"content": "<pad>"}})
    h = load_tokenizer(tokenizer_id=str(a))
    assert (h.bos_token_id, h.eos_token_id, h.pad_token_id) == (None, 2, 2)
    assert h.notes["bos"] == "tokenizer_config.json sets bos_token to null"
    # special_tokens_map.json wins over tokenizer_config.json, as in transformers
    b = save_folder(tmp_path / "b", tok, config={"eos_token": "<pad>"}, special_map={"eos_token": "</s>"})
    assert load_tokenizer(tokenizer_id=str(b)).eos_token_id == 1
    # a name not in the vocabulary is reported
    c = save_folder(tmp_path / "c", tok, config={"eos_token": "<|nope|>"})
    hc = load_tokenizer(tokenizer_id=str(c))
    assert hc.eos_token_id is None and "<|nope|>" in hc.notes["eos"]
    # the file path alone ignores the folder's config: heuristics
    assert load_tokenizer(tokenizer_id=str(a / "tokenizer.json")).bos_token_id == 0


def test_hf_like_objects_specials_come_from_their_attributes():
    fast = load_tokenizer(FakeFastTokenizer(make_tokenizer(), bos=None, pad=None))
    assert (fast.bos_token_id, fast.eos_token_id, fast.pad_token_id) == (None, 1, None)
    fn = load_tokenizer(CallableTokenizer(make_tokenizer(), bos=None, eos=7, pad=None))
    assert (fn.bos_token_id, fn.eos_token_id, fn.pad_token_id) == (None, 7, None)


def test_handle_pickles_as_json_and_rebuilds_once(tok, folder, monkeypatch):
    builds = count_builds(monkeypatch)
    h = load_tokenizer(tokenizer_id=str(folder)).use_backend("tokenizers")  # the reference's object
    assert len(builds) == 1
    blob = pickle.dumps(h)
    assert len(blob) < 2 * len(h.json_str()) + 2000  # the JSON string, not a Rust object's state
    copy = pickle.loads(blob)
    assert not copy.built and len(builds) == 1  # rebuilt lazily
    for _ in range(3):
        assert rows(*copy.encode_ids(TEXTS[:5])) == reference_ids(tok, TEXTS[:5])
    assert len(builds) == 2
    assert copy.identity() == h.identity() and (copy.bos_token_id, copy.eos_token_id) == (0, 1)
    c = pickle.loads(pickle.dumps(load_tokenizer(CallableTokenizer(make_tokenizer()))))
    assert rows(*c.encode_ids(TEXTS[:5])) == reference_ids(tok, TEXTS[:5])


def test_a_file_is_loaded_once_per_process_and_its_handles_share_it(tok, folder, tmp_path, monkeypatch):
    folder = shutil.copytree(folder, tmp_path / "tok")
    builds = count_builds(monkeypatch)
    a, b = load_tokenizer(tokenizer_id=str(folder)), load_tokenizer(tokenizer_id=str(folder))
    assert len(builds) == 1 and a.tokenizer is b.tokenizer
    a.materialize()
    b.materialize()
    assert len(builds) == 1  # shared, not copied
    # one handle truncating builds its own copy; the shared one keeps encoding whole rows
    assert rows(*a.encode_ids(TEXTS[:5], truncate_to=2)) == [r[:2] for r in reference_ids(tok, TEXTS[:5])]
    assert len(builds) == 2 and a.tokenizer is not b.tokenizer and b.tokenizer.truncation is None
    assert rows(*b.encode_ids(TEXTS[:5])) == reference_ids(tok, TEXTS[:5])
    # a changed file is loaded again
    config = folder / "tokenizer_config.json"
    config.write_text(config.read_text() + " ")
    load_tokenizer(tokenizer_id=str(folder))
    assert len(builds) == 3


def test_identity_is_the_content(tok, folder, tmp_path):
    assert load_tokenizer(tok).identity() == load_tokenizer(make_tokenizer()).identity()
    assert load_tokenizer(tok).identity() != load_tokenizer(make_tokenizer(("<|endoftext|>",))).identity()
    other = save_folder(tmp_path / "other", tok, config={"eos_token": "<pad>"})
    assert path_identity(other) != path_identity(folder)
    assert path_identity(str(folder)) == path_identity(folder)


def test_callable_output_must_have_input_ids():
    h = load_tokenizer(lambda texts, add_special_tokens=False: {"ids": [[1]] * len(texts)})
    with pytest.raises(TypeError, match="input_ids"):
        h.encode_ids(["a"])


_FALLBACK_IDS_IN_A_CHILD = """
from zephon_columnar.ops.tokenize.load import load_tokenizer
flat, offsets = load_tokenizer(tokenizer_id="__fallback__").encode_ids(["the cat sat", "on the mat"])
print(flat.tolist(), offsets.tolist())
"""


def test_the_fallback_stub_tokenizer_is_the_same_in_every_process():
    # Zephon's stub hashes words with Python's per-process salted hash(); ours must give the same
    # ids in another interpreter (another hash seed), or runners and restarts would disagree.
    import os
    import subprocess
    import sys

    flat, offsets = load_tokenizer(tokenizer_id="__fallback__").encode_ids(["the cat sat", "on the mat"])
    child = subprocess.run([sys.executable, "-c", _FALLBACK_IDS_IN_A_CHILD], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True)
    assert child.stdout.strip() == f"{flat.tolist()} {offsets.tolist()}"
    assert rows(flat, offsets)[0][0] == rows(flat, offsets)[1][1]  # "the", twice
    assert min(flat.tolist()) >= 10  # content ids never collide with pad=0, bos=1, eos=2
    handle = load_tokenizer(tokenizer_id="__fallback__")
    assert (handle.pad_token_id, handle.bos_token_id, handle.eos_token_id) == (0, 1, 2)


@pytest.mark.parametrize(
    ("specials", "expected"),
    [
        (("[UNK]", "[BOS]", "[EOS]", "[PAD]"), (1, 2, 3)),
        (("<unk>", "<|bos|>", "<|eos|>", "<|pad|>"), (1, 2, 3)),
        (("<UNK>", "<BOS>", "<EOS>"), (1, 2, None)),
    ],
)
def test_a_bare_tokenizer_json_finds_specials_named_for_their_role_as_a_folder_config_would(
    tmp_path, specials, expected
):
    tok = make_tokenizer(specials)
    (tmp_path / "bare").mkdir()
    tok.save(str(tmp_path / "bare" / "tokenizer.json"))
    bare = load_tokenizer(tokenizer_id=str(tmp_path / "bare" / "tokenizer.json"))
    assert (bare.bos_token_id, bare.eos_token_id, bare.pad_token_id) == expected
    names = dict(zip(("bos_token", "eos_token", "pad_token"), specials[1:]))
    folder = load_tokenizer(tokenizer_id=save_folder(tmp_path / "folder", tok, config=names))
    assert (folder.bos_token_id, folder.eos_token_id, folder.pad_token_id) == expected
    assert (load_tokenizer(tok).eos_token_id, bare.eos_token_id) == (expected[1], expected[1])


def test_the_post_processor_template_names_bos_and_eos_whatever_they_are_called(tmp_path):
    from tokenizers import processors

    tok = make_tokenizer(("<unk>", "<start>", "<end>"))
    tok.post_processor = processors.TemplateProcessing(
        single="<start> $A <end>", special_tokens=[("<start>", 1), ("<end>", 2)]
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    handle = load_tokenizer(tokenizer_id=str(tmp_path / "tokenizer.json"))
    assert (handle.bos_token_id, handle.eos_token_id) == (1, 2)


def test_a_bare_files_padding_names_its_pad(tmp_path):
    tok = make_tokenizer(("<unk>", "<blank>"))
    tok.enable_padding(pad_id=1, pad_token="<blank>")
    tok.save(str(tmp_path / "tokenizer.json"))
    handle = load_tokenizer(tokenizer_id=str(tmp_path / "tokenizer.json"))
    assert handle.pad_token_id == 1
    assert handle.tokenizer.padding is None  # and the handle itself does not pad
