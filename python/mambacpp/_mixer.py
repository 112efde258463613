"""Mamba2Mixer / MambaMixer: the mixer alone, as transformers' Mamba2Mixer / MambaMixer and mamba_ssm's Mamba2 /
Mamba modules compute it (no block norm, no residual), from a dict of weights named as their state_dicts name them,
or from a loaded model's layer. Thin bindings over the C++ mixer (include/mambacpp/mixer.h): the weights are copied
once into it, and it runs the model's own mixer code.
"""

import math
import types

import numpy as np

from . import _checks
from ._errors import InvalidArgumentError
from ._mambacpp import _Mixer as _NativeMixer, _Model as _NativeModel
from ._safetensors import read_tensors
from ._state import State

_MAMBA2_KEYS = ("in_proj.weight", "conv1d.weight", "dt_bias", "A_log", "D", "norm.weight", "out_proj.weight")
_MAMBA1_KEYS = ("in_proj.weight", "conv1d.weight", "x_proj.weight", "dt_proj.weight", "dt_proj.bias", "A_log", "D",
                "out_proj.weight")
_OPTIONAL = ("in_proj.bias", "out_proj.bias", "conv1d.bias")


def _weight_array(value, name):
    """A float array as the native mixer takes it: float32, or float16 as given (others become float32)."""
    a = _checks.as_array(value, f"weights['{name}']")
    if a.dtype.kind != "f":
        raise InvalidArgumentError(f"weights['{name}']: expected a float array, found dtype {a.dtype}")
    return np.ascontiguousarray(a if a.dtype in (np.float32, np.float16) else a.astype(np.float32))


class _Mixer:
    _arch = None
    _keys = ()

    def __init__(self, weights, *, norm_eps=1e-5, device="cpu", threads=0, **hyper):
        if not hasattr(weights, "items"):
            raise InvalidArgumentError(f"weights: expected a dict of arrays named as mamba_ssm names them, found "
                                       f"{type(weights).__name__}")
        w = {}
        for k, v in weights.items():
            if k not in self._keys + _OPTIONAL:
                raise InvalidArgumentError(f"weights: unexpected '{k}' for a {type(self).__name__} (expected "
                                           f"{', '.join(self._keys)} and optionally {', '.join(_OPTIONAL)})")
            w[k] = _weight_array(v, k)
        missing = [k for k in self._keys if k not in w]
        if missing:
            raise InvalidArgumentError(f"weights: missing {', '.join(repr(k) for k in missing)} for a "
                                       f"{type(self).__name__}")
        if ("in_proj.bias" in w) != ("out_proj.bias" in w):
            raise InvalidArgumentError("weights: in_proj.bias and out_proj.bias come together (use_bias), found one")
        self.norm_eps = _checks.number(norm_eps, "norm_eps")
        if not self.norm_eps > 0:
            raise InvalidArgumentError(f"norm_eps: expected > 0, found {self.norm_eps}")
        if not isinstance(device, str):
            raise InvalidArgumentError(f"device: expected 'auto', 'cpu' or 'cuda', found {device!r}")
        threads = _checks.integer(threads, "threads", 0)
        config = self._config(w, **hyper)
        self._native = _NativeMixer(self._arch, config, w, device, "", threads)
        self.config = types.MappingProxyType(self._native.config)
        self.d_model = self.config["d_model"]

    def _common(self, w, d_inner, d_state):
        return {"d_model": int(w["in_proj.weight"].shape[1]), "d_state": int(d_state),
                "d_conv": int(w["conv1d.weight"].shape[-1]), "d_inner": int(d_inner), "norm_eps": self.norm_eps,
                "use_bias": "in_proj.bias" in w, "use_conv_bias": "conv1d.bias" in w}

    @classmethod
    def from_model(cls, model, layer, **kwargs):
        """The mixer of ``model``'s layer ``layer``, its weights read again from the checkpoint's safetensors files
        (the C++ API does not expose a loaded model's weights; pytorch_model.bin checkpoints are not read here)."""
        if not isinstance(getattr(model, "_native", None), _NativeModel):
            raise InvalidArgumentError(f"model: expected a mambacpp.Model, found {type(model).__name__}")
        if model.config["arch"] != cls._arch:
            raise InvalidArgumentError(f"model: a {model.config['arch']} model has no {cls.__name__} layers")
        layer = _checks.integer(layer, "layer", 0, model.n_layer - 1)
        c = model.config
        weights = read_tensors(model.path, f"backbone.layers.{layer}.mixer.")
        kwargs.setdefault("device", model.device)  # the model's device unless asked otherwise
        return cls(weights, norm_eps=c["norm_eps"], **cls._hyper_of(c), **kwargs)

    @property
    def device(self):
        """"cpu" or "cuda"."""
        return self._native.device

    def new_state(self, batch=1):
        """A fresh state (conv inputs and SSM state) for ``batch`` sequences."""
        return State(self._native.new_state(_checks.integer(batch, "batch", 1)), self)

    def _state_for(self, state, batch):
        if state is None:
            return self.new_state(batch)
        if not isinstance(state, State) or state._model is not self:
            raise InvalidArgumentError("state: expected a State made by this mixer's new_state (or None)")
        if state.batch != batch:
            raise InvalidArgumentError(f"state: holds {state.batch} sequences, expected {batch} (x's B)")
        return state

    def __call__(self, x, state=None):
        """Returns ``(y, state)`` for float32 ``x`` ``[B, L, d_model]`` (or ``[L, d_model]``); chunks of any length
        continue ``state`` (a new one when None)."""
        a, batched = _checks.floats(x, "x", self.d_model)
        state = self._state_for(state, a.shape[0])
        with state._lock:
            y = self._native.forward(state._native, a)
        return (y if batched else y[0]), state

    forward = __call__

    def step(self, x, state=None):
        """One token per sequence: float32 ``x`` ``[B, d_model]`` (or ``[d_model]``) -> ``(y, state)``, the same as
        ``forward`` of ``x[:, None]``."""
        a = _checks.as_array(x, "x")
        if a.ndim not in (1, 2):
            raise InvalidArgumentError(f"x: expected [B, {self.d_model}] or [{self.d_model}], found shape "
                                       f"{list(a.shape)}")
        rows, _ = _checks.floats(a.reshape(a.shape[0], 1, a.shape[1]) if a.ndim == 2 else a[np.newaxis], "x",
                                 self.d_model)
        rows = np.ascontiguousarray(rows[:, 0])
        state = self._state_for(state, rows.shape[0])
        with state._lock:
            y = self._native.step(state._native, rows)
        return (y if a.ndim == 2 else y[0]), state

    def __repr__(self):
        return f"{type(self).__name__}(d_model={self.d_model}, device='{self.device}')"


class Mamba2Mixer(_Mixer):
    """mamba_ssm's ``Mamba2`` mixer (in_proj, conv1d, SSD scan, gated RMSNorm, out_proj), without block norm or
    residual. ``weights``: ``in_proj.weight``, ``conv1d.weight``, ``dt_bias``, ``A_log``, ``D``, ``norm.weight``,
    ``out_proj.weight`` (and ``conv1d.bias``, ``in_proj.bias``/``out_proj.bias`` when present); the sizes follow
    from their shapes, except ``n_groups`` (default 1, as in mamba_ssm). ``norm_eps``: the gated norm's epsilon."""

    _arch = "mamba2"
    _keys = _MAMBA2_KEYS

    def __init__(self, weights, *, n_groups=1, chunk_size=256, dt_limit=(0.0, math.inf), norm_eps=1e-5,
                 device="cpu", threads=0):
        super().__init__(weights, norm_eps=norm_eps, device=device, threads=threads, n_groups=n_groups,
                         chunk_size=chunk_size, dt_limit=dt_limit)

    def _config(self, w, n_groups, chunk_size, dt_limit):
        n_groups = _checks.integer(n_groups, "n_groups", 1)
        n_heads = int(w["A_log"].shape[0])
        d_inner = int(w["out_proj.weight"].shape[-1])
        gn = (int(w["conv1d.weight"].shape[0]) - d_inner) // 2
        if gn <= 0 or gn % n_groups or d_inner % max(n_heads, 1):
            raise InvalidArgumentError(f"weights: conv1d.weight has {w['conv1d.weight'].shape[0]} channels, "
                                       f"expected d_inner + 2 * n_groups * d_state with d_inner = {d_inner} "
                                       f"(out_proj.weight) and n_groups = {n_groups}")
        lo, hi = (float(v) for v in dt_limit)
        return {**self._common(w, d_inner, gn // n_groups), "n_heads": n_heads, "head_dim": d_inner // n_heads,
                "n_groups": n_groups, "chunk_size": _checks.integer(chunk_size, "chunk_size", 1), "dt_min": lo,
                "dt_max": hi}

    @staticmethod
    def _hyper_of(c):
        return dict(n_groups=c["n_groups"], chunk_size=c["chunk_size"], dt_limit=(c["dt_min"], c["dt_max"]))


class MambaMixer(_Mixer):
    """mamba_ssm's ``Mamba`` (Mamba-1) mixer (in_proj, conv1d, selective scan, out_proj), without block norm or
    residual. ``weights``: ``in_proj.weight``, ``conv1d.weight``, ``x_proj.weight``, ``dt_proj.weight``,
    ``dt_proj.bias``, ``A_log``, ``D``, ``out_proj.weight`` (and the optional biases); sizes follow from the shapes.
    ``mixer_rms_eps > 0``: FalconMamba's mixer (unweighted RMS norms on dt, B and C, with this eps)."""

    _arch = "mamba"
    _keys = _MAMBA1_KEYS

    def __init__(self, weights, *, mixer_rms_eps=0.0, norm_eps=1e-5, device="cpu", threads=0):
        super().__init__(weights, norm_eps=norm_eps, device=device, threads=threads, mixer_rms_eps=mixer_rms_eps)

    def _config(self, w, mixer_rms_eps):
        d_inner, d_state = (int(s) for s in w["A_log"].shape)
        return {**self._common(w, d_inner, d_state), "dt_rank": int(w["dt_proj.weight"].shape[1]),
                "mixer_rms_eps": _checks.number(mixer_rms_eps, "mixer_rms_eps")}

    @staticmethod
    def _hyper_of(c):
        return {"mixer_rms_eps": c.get("mixer_rms_eps", 0.0)}
