"""Mamba2Mixer / MambaMixer: the mixer alone, as mamba_ssm's Mamba2 / Mamba modules compute it (no block norm, no
residual), from a dict of weights named as mamba_ssm names them, or from a loaded model's layer.

The C++ API has no mixer-only layer (MambaBlock computes x + mixer(rmsnorm(x) * w)), so a mixer runs as a one-layer
model of its own whose block-norm weight is a constant S (a power of two). For an input row u with mean square m, the
row fed to the block is x = c * u with c = sqrt(eps / (S^2 - m)): then rmsnorm(x) * S = u * c * S / sqrt(c^2 m + eps)
= u exactly (c^2 S^2 = c^2 m + eps), and mixer(u) = block(x) - x, where x is ~1e-7 of u so the subtraction costs
nothing measurable. eps stays the mixer's own (Mamba-2's gated norm uses it too). Rows with m >= S^2 are refused.
"""

import math
import os
import tempfile
import weakref

import numpy as np

from . import _checks
from ._block import MambaBlock
from ._errors import InvalidArgumentError
from ._model import Model
from ._safetensors import read_tensors, write_f32

_S = 4096.0
_MAMBA2_KEYS = ("in_proj.weight", "conv1d.weight", "dt_bias", "A_log", "D", "norm.weight", "out_proj.weight")
_MAMBA1_KEYS = ("in_proj.weight", "conv1d.weight", "x_proj.weight", "dt_proj.weight", "dt_proj.bias", "A_log", "D",
                "out_proj.weight")
_OPTIONAL = ("in_proj.bias", "out_proj.bias", "conv1d.bias")


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
            a = _checks.as_array(v, f"weights['{k}']")
            if a.dtype.kind != "f":
                raise InvalidArgumentError(f"weights['{k}']: expected a float array, found dtype {a.dtype}")
            w[k] = a.astype(np.float32)
        missing = [k for k in self._keys if k not in w]
        if missing:
            raise InvalidArgumentError(f"weights: missing {', '.join(repr(k) for k in missing)} for a "
                                       f"{type(self).__name__}")
        if ("in_proj.bias" in w) != ("out_proj.bias" in w):
            raise InvalidArgumentError("weights: in_proj.bias and out_proj.bias come together (use_bias), found one")
        self.norm_eps = _checks.number(norm_eps, "norm_eps")
        if not self.norm_eps > 0:
            raise InvalidArgumentError(f"norm_eps: expected > 0, found {self.norm_eps}")
        config = self._config(w, **hyper)
        self.d_model = config["d_model"]
        tensors = {"backbone.embeddings.weight": np.zeros((8, self.d_model), np.float32),
                   "backbone.norm_f.weight": np.ones(self.d_model, np.float32),
                   "backbone.layers.0.norm.weight": np.full(self.d_model, _S, np.float32)}
        tensors.update({"backbone.layers.0.mixer." + k: v for k, v in w.items()})
        tmp = tempfile.TemporaryDirectory(prefix="mambacpp_mixer_")
        self._cleanup = weakref.finalize(self, tmp.cleanup)
        import json
        with open(os.path.join(tmp.name, "config.json"), "w") as f:
            json.dump(config, f)
        write_f32(os.path.join(tmp.name, "model.safetensors"), tensors)
        self._model = Model(tmp.name, device=device, dtype="fp32", threads=threads)  # f32 weights on a GPU too
        self._block = MambaBlock(self._model, 0)
        self.config = self._model.config

    def _common(self, w, d_inner, d_state, **rest):
        return {"mambacpp_config": 1, "arch": self._arch, "d_model": int(w["in_proj.weight"].shape[1]), "n_layer": 1,
                "vocab_size": 8, "d_state": int(d_state), "d_conv": int(w["conv1d.weight"].shape[-1]),
                "d_inner": int(d_inner), "norm_eps": self.norm_eps, "use_bias": "in_proj.bias" in w,
                "use_conv_bias": "conv1d.bias" in w, "residual_in_fp32": True, "tie_embeddings": True,
                "bos_token_id": -1, "eos_token_id": -1, "pad_token_id": -1, **rest}

    @classmethod
    def from_model(cls, model, layer, **kwargs):
        """The mixer of ``model``'s layer ``layer``, its weights read again from the checkpoint's safetensors files
        (the C++ API does not expose a loaded model's weights; pytorch_model.bin checkpoints are not read here)."""
        if not isinstance(model, Model):
            raise InvalidArgumentError(f"model: expected a mambacpp.Model, found {type(model).__name__}")
        if model.config["arch"] != cls._arch:
            raise InvalidArgumentError(f"model: a {model.config['arch']} model has no {cls.__name__} layers")
        layer = _checks.integer(layer, "layer", 0, model.n_layer - 1)
        c = model.config
        weights = read_tensors(model.path, f"backbone.layers.{layer}.mixer.")
        return cls(weights, norm_eps=c["norm_eps"], device=model.device, **cls._hyper_of(c), **kwargs)

    def new_state(self, batch=1):
        """A fresh state (conv inputs and SSM state) for ``batch`` sequences."""
        return self._block.new_state(batch)

    def __call__(self, x, state=None):
        """Returns ``(y, state)`` for float32 ``x`` ``[B, L, d_model]`` (or ``[L, d_model]``); chunks of any length
        continue ``state`` (a new one when None)."""
        a, batched = _checks.floats(x, "x", self.d_model)
        u = a.astype(np.float64)
        m = np.mean(u * u, axis=-1, keepdims=True)
        if not np.all(m < _S * _S / 4):
            raise InvalidArgumentError(f"x: expected rows with a mean square below {_S * _S / 4:g} and finite, found "
                                       f"{float(np.max(m)):g}")
        xin = (u * np.sqrt(self.norm_eps / (_S * _S - m))).astype(np.float32)
        y, state = self._block(xin, state)
        out = y - xin
        return (out if batched else out[0]), state

    forward = __call__


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
        return self._common(w, d_inner, gn // n_groups, dt_rank=0, n_heads=n_heads, head_dim=d_inner // n_heads,
                            n_groups=n_groups, chunk_size=_checks.integer(chunk_size, "chunk_size", 1), dt_min=lo,
                            dt_max={"__float__": "Infinity"} if math.isinf(hi) else hi)

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
        rest = {}
        mixer_rms_eps = _checks.number(mixer_rms_eps, "mixer_rms_eps")
        if mixer_rms_eps:  # FalconMamba: unweighted RMS norms on dt, B and C
            rest["mixer_rms_eps"] = mixer_rms_eps
        return self._common(w, d_inner, d_state, dt_rank=int(w["dt_proj.weight"].shape[1]), n_heads=0, head_dim=0,
                            n_groups=1, chunk_size=256, dt_min=0.0, dt_max={"__float__": "Infinity"}, **rest)

    @staticmethod
    def _hyper_of(c):
        return {"mixer_rms_eps": c.get("mixer_rms_eps", 0.0)}
