"""Argument checks: numpy (or DLPack) input into the arrays the native module takes, with messages that name the
argument, what was expected and what was found."""

import numpy as np

from ._errors import InvalidArgumentError


def as_array(value, name):
    """A numpy array of `value` (a list, a numpy array, or a CPU tensor with __dlpack__, e.g. torch)."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__dlpack__") and hasattr(value, "__dlpack_device__"):
        try:
            return np.from_dlpack(value)
        except (RuntimeError, TypeError, BufferError) as e:
            raise InvalidArgumentError(f"{name}: cannot read it through DLPack ({e}); expected a CPU tensor") from None
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as e:
        raise InvalidArgumentError(f"{name}: expected a rectangular array, found {type(value).__name__} ({e})") from None


def token_ids(value, name, vocab_size, allow_batch=True):
    """`value` as int32 ids [B, L], and whether it was batched ([B, L] rather than [L])."""
    a = as_array(value, name)
    if a.size == 0:
        raise InvalidArgumentError(f"{name}: expected at least one token id, found none (shape {a.shape})")
    if a.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{name}: expected integer token ids, found dtype {a.dtype}")
    if a.ndim not in ((1, 2) if allow_batch else (1,)):
        expected = "a list or 1-D array [L], or a 2-D array [B, L]" if allow_batch else "a list or 1-D array [L]"
        raise InvalidArgumentError(f"{name}: expected {expected}, found {a.ndim} dimensions (shape {a.shape})")
    low, high = int(a.min()), int(a.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        where = np.unravel_index(int(np.argmax(a == bad)), a.shape)
        raise InvalidArgumentError(f"{name}: expected token ids in [0, {vocab_size}), found {bad} at index "
                                   f"{where[0] if a.ndim == 1 else tuple(int(i) for i in where)}")
    batched = a.ndim == 2
    return np.ascontiguousarray(a.reshape(a.shape if batched else (1, a.shape[0])), dtype=np.int32), batched


_EMBEDDING_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.uint16))


def embeddings(value, name, d_model):
    """`value` as float32/float16/bfloat16-as-uint16 embeddings [B, L, d_model], and whether it was batched."""
    a = as_array(value, name)
    if a.dtype not in _EMBEDDING_DTYPES:
        raise InvalidArgumentError(f"{name}: expected dtype float32 or float16 (or uint16 holding bfloat16 bits), "
                                   f"found {a.dtype}; convert with .astype(numpy.float32)")
    if a.ndim not in (2, 3):
        raise InvalidArgumentError(f"{name}: expected [L, {d_model}] or [B, L, {d_model}] (d_model = {d_model}), "
                                   f"found {a.ndim} dimensions (shape {a.shape})")
    if a.shape[-1] != d_model or a.shape[-2] == 0 or (a.ndim == 3 and a.shape[0] == 0):
        expected = f"[L >= 1, {d_model}]" if a.ndim == 2 else f"[B >= 1, L >= 1, {d_model}]"
        raise InvalidArgumentError(f"{name}: expected shape {expected} (d_model = {d_model}), found {list(a.shape)}")
    batched = a.ndim == 3
    return np.ascontiguousarray(a if batched else a[np.newaxis]), batched


def floats(value, name, d_model):
    """`value` as float32 [B, L, d_model] (the block layer's input), and whether it was batched."""
    a = as_array(value, name)
    if a.dtype != np.float32:
        raise InvalidArgumentError(f"{name}: expected dtype float32, found {a.dtype}; convert with "
                                   f".astype(numpy.float32)")
    return embeddings(a, name, d_model)


def integer(value, name, low=None, high=None):
    """`value` as an int within [low, high] (either bound may be None)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(f"{name}: expected an integer, found {type(value).__name__} {value!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        lo = "" if low is None else f"{low} <= "
        hi = "" if high is None else f" <= {high}"
        raise InvalidArgumentError(f"{name}: expected {lo}{name}{hi}, found {value}")
    return value


def number(value, name):
    """`value` as a float (the native side checks its range)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidArgumentError(f"{name}: expected a number, found {type(value).__name__} {value!r}")
    return float(value)


def strings(value, name):
    """None, a str or a sequence of str as a list of str."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not all(isinstance(s, str) for s in value):
        raise InvalidArgumentError(f"{name}: expected a str or a list of str, found {value!r}")
    return list(value)
