"""Who turns text into ids for a `TokenizerHandle`: the tokenizer backend.

- ``"tokenizers"``: Hugging Face ``tokenizers`` (``encode_batch_fast``), the reference.
- ``"fastokens"``: the ``fastokens`` Rust BPE encoder (optional extra ``fast``): one
  ``encode_batch_flat`` call gives a whole frame's ids as one ``uint32`` buffer plus offsets, no
  Python object per token or per document.
- ``"auto"`` (what ``tokenize`` uses unless told otherwise): ``fastokens`` where it is proven to
  give this tokenizer's ids, else ``tokenizers``.

Proven, not assumed, once per process and tokenizer (`FastokensProof`, shared by every handle
and operator copy of that tokenizer), in three steps; the first that fails keeps ``tokenizers``
and says why once (a log line, ``explain()``, and a `ConfigurationWarning` when fastokens
loaded the tokenizer but gave other ids):

1. `unsupported_parts`: every part of the ``tokenizer.json`` (model, normalizer,
   pre-tokenizer, post-processor) is a kind the equivalence checks cover;
2. `probe_difference`: the two backends agree on `PROBE_TEXTS` (normalization forms, combining
   marks, emoji, CJK, right-to-left text, control characters, whitespace runs, special-token
   strings inside text, a long word and a long document, empty strings), with and without the
   tokenizer's own special tokens;
3. the first frame of real data, encoded by both.

``tokenizers`` encodes the first frame (the ids delivered for it); then a thread builds the
fastokens tokenizer, and the next frame's call runs steps 2 and 3 and settles. So the first
batch comes about as soon as it does without fastokens, and no id reaches the stream before
the backend giving it is proven.

Example:
    >>> unsupported_parts({"model": {"type": "WordPiece"}, "normalizer": None})
    ['model WordPiece']
    >>> unsupported_parts({"model": {"type": "BPE", "dropout": None}, "pre_tokenizer": {"type": "ByteLevel"}})
    []
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon_columnar.errors import ConfigurationWarning, warn

log = logging.getLogger(__name__)

Encoded = tuple[np.ndarray, np.ndarray]
"""(int32 ids, int64 row offsets): what every backend's encoding is turned into."""
#: ``TokenizerHandle._encode_reference``: tokenizers' encoding of (texts, add_special_tokens,
#: truncate_to).
Reference = Callable[[list[str], bool, "int | None"], Encoded]

#: ``tokenizer.json`` parts the fastokens path is checked for, by ``type``.
SUPPORTED_NORMALIZERS = frozenset(
    {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Prepend", "Replace", "Strip", "Sequence"}
)
SUPPORTED_PRE_TOKENIZERS = frozenset({"ByteLevel", "Split", "Metaspace", "Digits", "Punctuation", "Sequence"})
SUPPORTED_POST_PROCESSORS = frozenset({"ByteLevel", "TemplateProcessing", "Sequence"})

_LONG_WORD = "supercalifragilistic" * 250  # 5,000 characters, no space
PROBE_TEXTS: tuple[str, ...] = (
    "",
    " ",
    "hello world",
    "Hello, World! How are you?  Fine.\n",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\nand\x0bvertical\x0cfeeds",
    "\t\t\t   \n\n\n      ",
    "a" + " " * 64 + "b",
    unicodedata.normalize("NFC", "café naïve résumé Ångström"),
    unicodedata.normalize("NFD", "café naïve résumé Ångström"),
    unicodedata.normalize("NFKC", "ﬁne ① ㎏ Ｆｕｌｌｗｉｄｔｈ"),
    "ﬁne ① ㎏ Ｆｕｌｌｗｉｄｔｈ",
    "e\u0301 a\u0308 o\u0302\u0323 Z\u0351\u0352\u0357",
    "emoji 😀👍🏽👨‍👩‍👧‍👦 🇫🇷 ❤️",
    "中文分词测试，日本語のテキスト、한국어 텍스트",
    "العربية نص من اليمين إلى اليسار עברית",
    "mixed \u202eRTL override\u202c and \u200bzero\u200cwidth\u200djoiners\ufeff",
    "control \x00\x01\x07\x1b[31m chars \x7f",
    "numbers 1234567890 3.14159 -42 1e10 0x1F",
    "code: def f(x):\n    return x ** 2  # comment\n",
    "<|endoftext|> text <|endoftext|><|endoftext|>",
    "<s> </s> <pad> [CLS] [SEP] <unk> <|im_start|>user<|im_end|>",
    "special<|endoftext|>glued<|pad|>tokens",
    "’curly‘ “quotes” — dashes – … ellipsis",
    "ʻokina ß ſ ǅ ﬀ Ⅻ",
    "\U0001f600" * 50,
    _LONG_WORD,
    " ".join(f"word{i}" for i in range(3000)),
)


def unsupported_parts(config: Mapping[str, Any]) -> list[str]:
    """The parts of a parsed ``tokenizer.json`` outside what the fastokens path is checked for
    (empty: all covered). A BPE model with dropout is out (its ids are random by design)."""
    out = []
    model = config.get("model") or {}
    if model.get("type") != "BPE":
        out.append(f"model {model.get('type')}")
    elif model.get("dropout") not in (None, 0, 0.0):
        out.append(f"BPE dropout {model.get('dropout')}")
    for key, allowed in (
        ("normalizer", SUPPORTED_NORMALIZERS),
        ("pre_tokenizer", SUPPORTED_PRE_TOKENIZERS),
        ("post_processor", SUPPORTED_POST_PROCESSORS),
    ):
        out += [f"{key} {kind}" for kind in _kinds(config.get(key)) if kind not in allowed]
    return out


def _kinds(part: Any) -> list[str]:
    """The ``type`` of a component and, for a ``Sequence``, of every member."""
    if not isinstance(part, Mapping):
        return []
    kinds = [str(part.get("type"))]
    for key in ("normalizers", "pretokenizers", "processors"):
        for member in part.get(key) or ():
            kinds += _kinds(member)
    return kinds


def encode_flat(fast: Any, texts: Sequence[str], *, add_special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
    """``fastokens.Tokenizer.encode_batch_flat`` as (int32 ids, int64 offsets), the shape
    `TokenizerHandle.encode_ids` returns: its little-endian uint32 / uint64 buffers read in
    place as int32 / int64 (ids and offsets are below 2**31 and 2**63), read-only."""
    ids, offsets = fast.encode_batch_flat(list(texts), add_special_tokens=add_special_tokens)
    return np.frombuffer(ids, np.dtype("<i4")), np.frombuffer(offsets, np.dtype("<i8"))


def first_difference(
    texts: Sequence[str], a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
) -> str | None:
    """None when two (ids, offsets) encodings of ``texts`` are equal, else the first text
    they differ on, shown short."""
    if np.array_equal(a[1], b[1]) and np.array_equal(a[0], b[0]):
        return None
    for i, text in enumerate(texts):
        x = a[0][a[1][i] : a[1][i + 1]]
        y = b[0][b[1][i] : b[1][i + 1]]
        if not np.array_equal(x, y):
            return f"text {i} ({text[:40]!r}): {x[:8].tolist()} against {y[:8].tolist()}"
    return "the encodings differ in length"


def probe_difference(
    got: Mapping[bool, Encoded], want: Mapping[bool, Encoded], texts: Sequence[str] = PROBE_TEXTS
) -> str | None:
    """None when two encoders' encodings of ``texts`` (by ``add_special_tokens``: False and
    True) are equal; else where they first differ."""
    for special in (False, True):
        diff = first_difference(texts, got[special], want[special])
        if diff is not None:
            return f"{diff} (add_special_tokens={special})"
    return None


def flat_encodings(encodings: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """``tokenizers`` encodings as (int32 ids, int64 offsets). Lengths from ``len(encoding)``
    (no list built), then one pass over the ids lists, each freed as soon as it is copied:
    measured ~1.5x faster than building the list of lists first, ~1.8x faster than pyarrow's
    list conversion, ~3x faster than ``Encoding.merge``."""
    n = len(encodings)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encodings), dtype=np.int64, count=n), out=offsets[1:])
    flat = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int32, count=int(offsets[-1]))
    return flat, offsets


# ---------------------------------------------------------------------- the proof, once per process
#: Seconds the proof's thread waits before building the fastokens tokenizer (see `_build`).
BUILD_DEFERRAL_S = 0.03


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What a `FastokensProof` settled on: the fastokens tokenizer to encode with (None: encode
    with tokenizers) and which backend runs and why (`TokenizerHandle.backend_note`)."""

    encoder: Any
    note: str
    #: fastokens loaded the tokenizer but gave other ids (a probe text or the first frame): a
    #: surprise worth a warning, where a tokenizer it is not made for falls back quietly.
    mismatch: bool = False


class FastokensProof:
    """Whether fastokens gives one tokenizer's ids: proved once per process and shared by
    every handle of that tokenizer (`shared_proof`), so operator copies on other threads and
    calibration clones neither repeat the work nor compete for the cores with it.

    Step 1 runs when the proof is made (`static_refusal`: cheap). `encode` has tokenizers
    encode the first non-empty frame (the ids it delivers), keeps it, and only then starts a
    thread that builds the fastokens tokenizer (a core for ~0.15 s with a 32k vocabulary; it
    releases the GIL) and encodes `PROBE_TEXTS` with it; started earlier, it slowed the first
    frame, and so the first batch, on 2 cores. The next call, which has to wait for the proof
    anyway, encodes the probe with tokenizers meanwhile (step 2), then the kept frame with
    fastokens (step 3), and settles the `verdict`. With ``strict`` (``backend="fastokens"``: a
    refusal should surface at once) the first frame waits for step 2 and is checked itself:
    encoded by both, tokenizers' ids delivered.
    """

    def __init__(self, json_str: str, refusal: Verdict | None = None) -> None:
        self._json = json_str
        # One caller at a time keeps a frame, starts the thread, probes or settles.
        self._lock = threading.RLock()
        self._probed: Verdict | None = refusal  # steps 1 and 2 (``refusal``: step 1's)
        self._built: tuple[Any, dict[bool, Encoded]] | Verdict | None = None  # the thread's outcome
        self._thread: threading.Thread | None = None
        self._kept: tuple[list[str], bool, int | None, Encoded] | None = None
        #: Settled: None until step 3 has run.
        self.verdict: Verdict | None = None

    def _start(self) -> None:
        """Start building the fastokens tokenizer on its thread (once; not after a refusal;
        under ``self._lock``)."""
        if self._thread is None and self._probed is None:
            # Not a daemon: a process exits only after the thread leaves fastokens' native code
            # (a daemon thread still in it at exit aborts the process).
            self._thread = threading.Thread(target=self._build, name="zephon-fastokens-proof")
            self._thread.start()

    def _build(self) -> None:
        # Building starts by holding the GIL for ~13 ms (parsing the JSON); deferred a little,
        # the first frame's assembly and the first batch's packing (Python) go first. Measured
        # (benchmarks/RESULTS.md, issue 27, session 30): first batch 174 -> 151 ms (medians of 7),
        # level with tokenizers alone (159).
        time.sleep(BUILD_DEFERRAL_S)
        self._built = build_fastokens(self._json)

    def wait(self) -> None:
        """Until the thread (if started) is done."""
        if self._thread is not None:
            self._thread.join()

    def probed(self, reference: Reference) -> Verdict:
        """Steps 1 and 2's outcome: the probe is encoded by ``reference`` here while the thread
        builds the fastokens tokenizer."""
        with self._lock:
            if self._probed is None:
                self._start()
                want = {special: reference(list(PROBE_TEXTS), special, None) for special in (False, True)}
                self.wait()
                built = self._built
                assert built is not None
                if isinstance(built, Verdict):
                    self._probed = built
                else:
                    fast, got = built
                    diff = probe_difference(got, want)
                    self._probed = (
                        Verdict(encoder=fast, note="fastokens (ids checked against tokenizers)")
                        if diff is None
                        else Verdict(
                            encoder=None,
                            mismatch=True,
                            note=f"tokenizers: fastokens gave other ids on a probe text, {diff}",
                        )
                    )
            return self._probed

    def encode(
        self,
        texts: list[str],
        *,
        add_special_tokens: bool,
        truncate_to: int | None,
        reference: Reference,
        strict: bool = False,
    ) -> Encoded:
        """The ids of ``texts`` from the backend proven for this tokenizer (cut to
        ``truncate_to`` ids a row); ``reference`` encodes with tokenizers. Until the proof
        settles, the ids delivered are tokenizers'."""
        if self.verdict is None and any(texts):  # an empty frame has nothing to prove on
            with self._lock:
                if self.verdict is None:
                    delivered = self._prove_on(texts, add_special_tokens, truncate_to, reference, strict)
                    if delivered is not None:
                        return delivered
        verdict = self.verdict
        if verdict is None or verdict.encoder is None:
            return reference(texts, add_special_tokens, truncate_to)
        return _fast_encode(verdict.encoder, texts, add_special_tokens, truncate_to)

    def _prove_on(
        self, texts: list[str], add_special_tokens: bool, truncate_to: int | None, reference: Reference, strict: bool
    ) -> Encoded | None:
        """Under the lock, unsettled: keep this first frame for step 3 and start the build, or
        settle (on the kept frame, or on this one). The ids of ``texts`` when tokenizers
        encoded them here, else None (the caller encodes with the verdict)."""
        if self._kept is None and self._probed is None and not strict:
            want = reference(texts, add_special_tokens, truncate_to)
            self._kept = (list(texts), add_special_tokens, truncate_to, want)
            self._start()
            return want
        probed = self.probed(reference)
        kept, delivered = self._kept, None
        if kept is None:
            delivered = reference(texts, add_special_tokens, truncate_to)
            kept = (texts, add_special_tokens, truncate_to, delivered)
        self.verdict = _settle(probed, *kept, quiet=strict)
        self._kept = None
        return delivered


def _settle(
    probed: Verdict, texts: list[str], add_special_tokens: bool, truncate_to: int | None, want: Encoded, *, quiet: bool
) -> Verdict:
    """Step 3 on a frame tokenizers encoded as ``want``; says the outcome once (``quiet``: no
    warning, the caller raises instead)."""
    verdict = probed
    if probed.encoder is not None:
        diff = first_difference(texts, _fast_encode(probed.encoder, texts, add_special_tokens, truncate_to), want)
        if diff is not None:
            verdict = Verdict(
                encoder=None, mismatch=True, note=f"tokenizers: fastokens gave other ids on the first frame, {diff}"
            )
    log.info("tokenize: encoding with %s", verdict.note)
    if verdict.mismatch and not quiet:
        warn(f"tokenize: {verdict.note}; encoding with tokenizers (the same ids, slower).", ConfigurationWarning)
    return verdict


def _fast_encode(encoder: Any, texts: Sequence[str], add_special_tokens: bool, truncate_to: int | None) -> Encoded:
    flat, offsets = encode_flat(encoder, texts, add_special_tokens=add_special_tokens)
    return (flat, offsets) if truncate_to is None else truncate_rows(flat, offsets, truncate_to)


def truncate_rows(flat: np.ndarray, offsets: np.ndarray, limit: int) -> Encoded:
    """Keep the first ``limit`` ids of every row (vectorized; rows already short are kept).

    Example:
        >>> flat, off = truncate_rows(np.arange(5, dtype=np.int32), np.array([0, 3, 5]), 2)
        >>> flat.tolist(), off.tolist()
        ([0, 1, 3, 4], [0, 2, 4])
    """
    lens = np.diff(offsets)
    if not len(lens) or int(lens.max()) <= limit:
        return flat, offsets
    keep_lens = np.minimum(lens, limit)
    pos = np.arange(len(flat), dtype=np.int64) - np.repeat(offsets[:-1], lens)
    new_off = np.zeros_like(offsets)
    np.cumsum(keep_lens, out=new_off[1:])
    return flat[pos < np.repeat(keep_lens, lens)], new_off


def static_refusal(reference: Any) -> Verdict | None:
    """Step 1 for a ``tokenizers.Tokenizer`` (read from its parts, without parsing its JSON),
    and whether fastokens is installed: a verdict refusing fastokens, or None to go on."""
    try:
        import fastokens  # noqa: F401 - only whether it is there
    except ImportError:
        return Verdict(
            encoder=None, note="tokenizers (fastokens is not installed: pip install 'zephon_columnar[fast]')"
        )
    parts = unsupported_parts(tokenizer_parts(reference))
    if parts:
        return Verdict(
            encoder=None, note=f"tokenizers: fastokens is not checked for this tokenizer's {', '.join(parts)}"
        )
    return None


def tokenizer_parts(tok: Any) -> dict[str, Any]:
    """What `unsupported_parts` reads of a ``tokenizers.Tokenizer``, as in its ``tokenizer.json``."""
    model = tok.model
    return {
        "model": {"type": type(model).__name__, "dropout": getattr(model, "dropout", None)},
        **{
            key: None if part is None else json.loads(part.__getstate__())
            for key, part in (
                ("normalizer", tok.normalizer),
                ("pre_tokenizer", tok.pre_tokenizer),
                ("post_processor", tok.post_processor),
            )
        },
    }


def build_fastokens(json_str: str) -> tuple[Any, dict[bool, Encoded]] | Verdict:
    """The fastokens tokenizer for ``json_str`` and its encodings of `PROBE_TEXTS` (by
    ``add_special_tokens``), or a verdict saying it cannot load the tokenizer."""
    import fastokens

    try:
        fast = fastokens.Tokenizer.from_json_str(json_str)
    except Exception as err:  # noqa: BLE001 - whatever the backend cannot load, tokenizers can
        return Verdict(
            encoder=None, note=f"tokenizers: fastokens cannot load this tokenizer ({type(err).__name__}: {err})"
        )
    return fast, {special: encode_flat(fast, PROBE_TEXTS, add_special_tokens=special) for special in (False, True)}


_proofs: dict[str, FastokensProof] = {}
_proofs_lock = threading.Lock()


def shared_proof(key: str, json_str: str, reference: Any) -> FastokensProof:
    """This process's proof for the tokenizer ``json_str`` (``key``: its content hash;
    ``reference``: that tokenizer, for step 1), started on first request."""
    proof = _proofs.get(key)
    if proof is None:
        with _proofs_lock:
            proof = _proofs.get(key)
            if proof is None:
                proof = _proofs[key] = FastokensProof(json_str, static_refusal(reference))
    return proof


def existing_proof(key: str) -> FastokensProof | None:
    """This process's proof for the tokenizer ``key`` names, None when none was started."""
    return _proofs.get(key)


def forget_proofs() -> None:
    """Drop this process's proofs (waiting for running ones), so each tokenizer is proved again
    on its next use (tests that change an encoder do this)."""
    with _proofs_lock:
        for proof in _proofs.values():
            proof.wait()
        _proofs.clear()


def after_fork_in_child() -> None:
    """A forked child has no proof thread and maybe a lock held by a thread it lost: it keeps
    the settled proofs only (their encoders work after a fork) and proves the others again
    (`zephon_columnar.ops.tokenize.fork` calls this in the child)."""
    global _proofs_lock
    _proofs_lock = threading.Lock()
    for key in [k for k, proof in _proofs.items() if proof.verdict is None]:
        del _proofs[key]
