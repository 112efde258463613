"""MambaBlock: one block of a loaded model as a layer of your own model."""

from . import _checks
from ._errors import InvalidArgumentError
from ._mambacpp import _Block, _Model
from ._state import State


class MambaBlock:
    """Block ``layer`` of ``model``: ``y = x + mixer(rmsnorm(x))`` on float32 ``[B, L, d_model]`` (or ``[L, d_model]``),
    the residual block as the model runs it, with its own state. Chunks of any length continue the state:
    ``y, state = block(x)`` then ``block(x2, state)``."""

    def __init__(self, model, layer):
        if not isinstance(getattr(model, "_native", None), _Model):
            raise InvalidArgumentError(f"model: expected a mambacpp.Model, found {type(model).__name__}")
        layer = _checks.integer(layer, "layer", 0, model.n_layer - 1)
        self.model = model
        self._native = _Block(model._native, layer)

    @property
    def layer(self):
        return self._native.layer

    def new_state(self, batch=1):
        """A fresh state of this block for ``batch`` sequences."""
        return State(self._native.new_state(_checks.integer(batch, "batch", 1)), self)

    def __call__(self, x, state=None):
        """Returns ``(y, state)``: ``y`` float32 of ``x``'s shape, and the updated state (a new one when None)."""
        a, batched = _checks.floats(x, "x", self.model.d_model)
        if state is None:
            state = self.new_state(a.shape[0])
        else:
            if not isinstance(state, State) or state._model is not self:
                raise InvalidArgumentError("state: expected a State made by this block's new_state (or None)")
            if state.batch != a.shape[0]:
                raise InvalidArgumentError(f"state: holds {state.batch} sequences, expected {a.shape[0]} (x's B)")
        with state._lock:
            y = self._native.forward(state._native, a)
        return (y if batched else y[0]), state

    forward = __call__

    def __repr__(self):
        return f"MambaBlock(layer={self.layer}, d_model={self.model.d_model})"
