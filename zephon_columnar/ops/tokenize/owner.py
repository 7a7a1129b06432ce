"""`TokenizerOwner`: what the tokenizing operators (``tokenize``, ``tokenize_chat``) share about
their tokenizer: a path loaded per worker or a wrapped object, its backend, its fingerprint."""

from __future__ import annotations

from zephon_columnar.ops.config import TokenizerBackend
from zephon_columnar.ops.tokenize.handle import TokenizerHandle, check_backend
from zephon_columnar.ops.tokenize.load import load_tokenizer, tokenizer_identity


class TokenizerOwner:
    """Mixin of the tokenizing operators: ``self._path`` (a tokenizer to load per worker) or
    ``self._handle`` (a wrapped object), as `tokenizer_source` returns them."""

    # The tokenizer runs on a worker while the lane's ordered stages run in the caller: frames
    # of 512 rows keep both busy (the knob sweep in benchmarks/RESULTS.md: 512 beat 256 and 1024).
    frame_rows: int | None = 512

    _path: str | None
    _handle: TokenizerHandle | None

    _identity: str | None
    _backend: TokenizerBackend = "auto"
    name: str  # the operator's (`BaseOp.name`)

    def _choose_backend(self, backend: TokenizerBackend) -> None:
        self._backend = check_backend(backend, self.name)

    def _ensure_handle(self) -> TokenizerHandle:
        if self._handle is None:
            assert self._path is not None
            self._handle = load_tokenizer(tokenizer_id=self._path)
        if self._handle.backend != self._backend:
            self._handle.use_backend(self._backend)
        return self._handle

    def preflight(self) -> None:
        """Load the tokenizer and encode a probe now; raise what the first frame would."""
        raise NotImplementedError(f"{type(self).__name__} must implement preflight().")

    def explain_note(self) -> str | None:
        """Which backend encodes (``explain()``): known once this process loaded the tokenizer."""
        if self._handle is None:
            return f"backend={self._backend}"
        return f"backend={self._backend}: {self._handle.backend_note}"

    def _tokenizer_fingerprint(self) -> str:
        """What the operator's fingerprint records of the tokenizer (computed once): the
        path's identity, or the wrapped object's identity and special ids."""
        if self._identity is None:
            if self._path is not None:
                self._identity = tokenizer_identity(tokenizer_id=self._path)
            else:
                assert self._handle is not None
                h = self._handle
                self._identity = f"{h.identity()}|bos={h.bos_token_id}|eos={h.eos_token_id}|pad={h.pad_token_id}"
        return self._identity
