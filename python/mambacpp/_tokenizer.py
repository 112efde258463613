"""Tokenizer: a model's tokenizer.json (byte-level BPE), token for token as HF tokenizers encodes and decodes."""

import os

import numpy as np

from . import _checks
from ._errors import InvalidArgumentError, MissingFileError
from ._mambacpp import _Tokenizer


class Tokenizer:
    """A tokenizer.json. ``encode`` matches HF's ``encode(text, add_special_tokens=False)``."""

    def __init__(self, path):
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise MissingFileError(f"path: tokenizer file '{path}' does not exist")
        self._native = _Tokenizer(path)
        self.path = path

    @property
    def vocab_size(self):
        """Highest id + 1, added tokens included."""
        return self._native.vocab_size

    def encode(self, text, add_special_tokens=False):
        """Text -> token ids (special tokens written in the text are matched as such). ``add_special_tokens``: also
        the post-processor's tokens around them (e.g. Llama's BOS), as HF's ``tokenizer(text)`` returns."""
        if not isinstance(text, str):
            raise InvalidArgumentError(f"text: expected a str, found {type(text).__name__}")
        return self._native.encode(text, bool(add_special_tokens))

    def decode(self, ids, skip_special=False):
        """Token ids -> text; bytes that are not valid UTF-8 (a cut character) become U+FFFD, and ids outside the
        vocabulary are skipped (as HF's decode does)."""
        return self._native.decode(self._ids(ids), bool(skip_special))

    def decode_bytes(self, ids, skip_special=False):
        """Token ids -> the exact bytes of the text."""
        return self._native.decode_bytes(self._ids(ids), bool(skip_special))

    def token_bytes(self, token_id):
        """The raw bytes one token contributes (may be part of a UTF-8 character; empty for an unknown id)."""
        return self._native.token_bytes(_checks.integer(token_id, "token_id", -2**31, 2**31 - 1))

    def token_to_id(self, token):
        """The id of a vocabulary entry, or None."""
        return self._native.token_to_id(token)

    def is_special(self, token_id):
        return self._native.is_special(_checks.integer(token_id, "token_id"))

    def _ids(self, ids):
        # Any 32-bit ids: decoding skips those outside the vocabulary, as HF's decode does.
        if isinstance(ids, (list, tuple)) and not ids:
            return []
        a = _checks.as_array(ids, "ids")
        if a.size and a.dtype.kind not in "iu":
            raise InvalidArgumentError(f"ids: expected integer token ids, found dtype {a.dtype}")
        if a.ndim != 1:
            raise InvalidArgumentError(f"ids: expected a list or 1-D array [L], found {a.ndim} dimensions")
        if a.size and (int(a.min()) < -2**31 or int(a.max()) >= 2**31):
            raise InvalidArgumentError(f"ids: expected 32-bit token ids, found {int(a.max()) if a.max() >= 2**31 else int(a.min())}")
        return a.astype(np.int64).tolist()

    def __repr__(self):
        return f"Tokenizer('{self.path}', vocab_size={self.vocab_size})"
