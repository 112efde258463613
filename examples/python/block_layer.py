"""MambaBlock inside a small numpy model: two blocks of the shipped model between a numpy input projection and a
numpy readout. The blocks keep their own state, so the sequence can arrive in chunks of any length and give what one
call over all of it gives.

    python3 examples/python/block_layer.py
"""

import numpy as np

import mambacpp


class TinyModel:
    """features [B, L, n_in] -> scores [B, L, n_out], with two Mamba blocks in the middle."""

    def __init__(self, model, n_in=12, n_out=3, seed=0):
        rng = np.random.default_rng(seed)
        d = model.d_model
        self.w_in = (rng.standard_normal((n_in, d)) / np.sqrt(n_in)).astype(np.float32)
        self.blocks = [model.block(0), model.block(1)]
        self.w_out = (rng.standard_normal((d, n_out)) / np.sqrt(d)).astype(np.float32)

    def new_state(self, batch):
        return [b.new_state(batch) for b in self.blocks]

    def __call__(self, features, state):
        x = features.astype(np.float32) @ self.w_in
        for block, s in zip(self.blocks, state):
            x, _ = block(x, s)
        return x @ self.w_out


def main():
    net = TinyModel(mambacpp.Model())
    features = np.random.default_rng(1).standard_normal((2, 40, 12)).astype(np.float32)
    whole = net(features, net.new_state(2))
    state = net.new_state(2)
    chunks = [net(features[:, a:b], state) for a, b in [(0, 7), (7, 8), (8, 40)]]
    streamed = np.concatenate(chunks, axis=1)
    err = np.abs(streamed - whole).max() / np.abs(whole).max()
    print(f"scores {whole.shape}; chunked vs one call: max relative difference {err:.2e}")
    assert err < 1e-5
    return err


if __name__ == "__main__":
    main()
