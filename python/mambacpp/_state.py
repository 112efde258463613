"""State: the recurrent state (conv + SSM, per layer) of a batch of sequences, separate from the model's weights."""

import os
import threading

import numpy as np

from . import _checks
from ._errors import MissingFileError


class State:
    """The state of ``batch`` sequences of one model (or of one MambaBlock). A forward call with it continues it:
    ``model.logits(a, state=s); model.logits(b, state=s)`` gives the logits of ``a + b``. Make one with
    ``Model.new_state``, ``Model.load_state`` or ``MambaBlock.new_state``."""

    def __init__(self, native, model, tokens=()):
        self._native = native
        self._model = model
        # The token ids this state stands for (batch 1): a loaded file's, then every id fed to it. Empty, for good,
        # once it has been fed embeddings (or when batch > 1); reset() starts over.
        self.tokens = list(tokens)
        self._tokens_known = True
        # One call at a time on a state: a forward releases the GIL, and the C++ StateCache is not thread-safe.
        self._lock = threading.Lock()

    @property
    def batch(self):
        """How many sequences (rows) it holds."""
        return self._native.n_slots

    @property
    def dtype(self):
        return self._native.dtype

    @property
    def nbytes(self):
        """Bytes of all rows' state."""
        return self._native.slot_bytes * self.batch

    def copy(self):
        """An independent copy (forking a sequence)."""
        with self._lock:
            c = State(self._native.clone(), self._model, self.tokens)
            c._tokens_known = self._tokens_known
            return c

    def reset(self, row=None):
        """Back to a fresh sequence (zeros): one row, or all of them."""
        with self._lock:
            if row is None:
                self._native.reset_all()
            else:
                self._native.reset(_checks.integer(row, "row"))
            self.tokens = []
            self._tokens_known = row is None or self.batch == 1

    def copy_row(self, src, dst):
        """Row ``dst`` becomes a copy of row ``src``."""
        with self._lock:
            self._native.copy_slot(_checks.integer(src, "src"), _checks.integer(dst, "dst"))

    def save(self, path, row=0, tokens=None):
        """Writes one row to a state file that records the model (config and weights hash) and the tokens the state
        stands for (default: ``self.tokens``). ``Model.load_state`` refuses a file of another model, and
        ``Engine.load_state`` serves a prompt that continues the tokens from it."""
        tokens = self.tokens if tokens is None else tokens
        ids = [] if len(tokens) == 0 else _checks.token_ids(tokens, "tokens", 2**31 - 1, allow_batch=False)[0][0]
        with self._lock:
            self._native.save(_checks.integer(row, "row"), os.fspath(path), [int(t) for t in ids])

    def load(self, path, row=0):
        """Reads a state file into one row; returns the tokens it stands for."""
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise MissingFileError(f"path: state file '{path}' does not exist")
        with self._lock:
            return self._native.load(_checks.integer(row, "row"), path)

    def _consumed(self, ids):
        """After a forward: `ids` were fed (batch 1), or None for embeddings / several rows."""
        if ids is None or not self._tokens_known:
            self.tokens, self._tokens_known = [], False
        else:
            self.tokens += ids

    def arrays(self):
        """Every layer's (conv, ssm) state as float32 numpy copies: conv ``[batch, conv_channels, d_conv - 1]``,
        ssm ``[batch, d_inner, d_state]`` (Mamba-1) or ``[batch, n_heads, head_dim, d_state]`` (Mamba-2)."""
        shapes = self._native.layer_shapes()
        with self._lock:
            rows = [self._native.read_slot(b) for b in range(self.batch)]
        out, at = [], 0
        for conv_shape, ssm_shape in shapes:
            pair = []
            for shape in (conv_shape, ssm_shape):
                n = int(np.prod(shape))
                pair.append(np.stack([r[at:at + n].reshape(shape) for r in rows]))
                at += n
            out.append(tuple(pair))
        return out

    def conv(self, layer):
        """Layer ``layer``'s conv state, ``[batch, conv_channels, d_conv - 1]`` float32 (a copy)."""
        return self.arrays()[self._layer(layer)][0]

    def ssm(self, layer):
        """Layer ``layer``'s SSM state, float32 (a copy)."""
        return self.arrays()[self._layer(layer)][1]

    def _layer(self, layer):
        n = len(self._native.layer_shapes())
        return _checks.integer(layer, "layer", 0, n - 1)

    def __repr__(self):
        return f"State(batch={self.batch}, dtype='{self.dtype}', layers={len(self._native.layer_shapes())})"
