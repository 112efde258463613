"""MambaBlock against the model it comes from: the embedding rows through every block, then norm_f and the LM head
(in float64 here, from the checkpoint's own tensors), give the model's logits. The block computes in float32 as the
model does, so the two differ by float32 rounding only; the C++ block test (tests/block_test.cpp) holds hidden
states to 1e-5 of their largest value, and the same bound holds for the logits. Chunked calls with a state equal one
call within the same bound."""

import numpy as np
import pytest

import mambacpp
from conftest import FIXTURES, max_rel_diff, read_safetensors, read_tokens

TOL = 1e-5


@pytest.mark.parametrize("name", ["mamba1_f32_untied_bias", "mamba2_f32_groups_bias"])
def test_stack_of_blocks_gives_the_model_logits(fixture_models, name):
    model = fixture_models[name]
    d = FIXTURES / "models" / name
    w = read_safetensors(d / "model.safetensors")
    ids = np.array([read_tokens(d / "tokens.txt")[:30], read_tokens(d / "tokens.txt")[15:45]])
    x = w["backbone.embeddings.weight"][ids].astype(np.float32)  # [2, 30, d_model]
    for layer in range(model.n_layer):
        x, _ = model.block(layer)(x)
    h = x.astype(np.float64)
    h = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + model.config["norm_eps"])
    h = h * w["backbone.norm_f.weight"]
    head = w.get("lm_head.weight", w["backbone.embeddings.weight"]).astype(np.float64)
    assert max_rel_diff(h @ head.T, model.logits(ids)) <= TOL


def test_block_is_not_the_identity(model):
    # A test of the stack above could pass by blocks that returned x; they must not.
    x = np.random.default_rng(1).standard_normal((1, 9, model.d_model)).astype(np.float32)
    y, _ = model.block(3)(x)
    assert y.shape == x.shape and y.dtype == np.float32
    assert np.abs(y - x).max() > 1e-3 * np.abs(x).max()


@pytest.mark.parametrize("name", ["mamba1_f32_untied_bias", "mamba2_f32_groups_bias"])
def test_chunks_with_a_state_equal_one_call(fixture_models, name):
    model = fixture_models[name]
    block = mambacpp.MambaBlock(model, 1)
    x = np.random.default_rng(2).standard_normal((2, 23, model.d_model)).astype(np.float32)
    whole, whole_state = block(x)
    state = block.new_state(2)
    parts = []
    for begin, end in [(0, 1), (1, 8), (8, 9), (9, 23)]:
        y, state = block(x[:, begin:end], state)
        parts.append(y)
    assert max_rel_diff(np.concatenate(parts, axis=1), whole) <= TOL
    for (c, s), (c2, s2) in zip(state.arrays(), whole_state.arrays()):
        assert max_rel_diff(c, c2) <= TOL and max_rel_diff(s, s2) <= TOL


def test_unbatched_input_and_rows_alone(model):
    block = model.block(0)
    x = np.random.default_rng(3).standard_normal((2, 5, model.d_model)).astype(np.float32)
    both, _ = block(x)
    alone, _ = block(x[1])
    assert alone.shape == (5, model.d_model)
    assert max_rel_diff(alone, both[1]) <= TOL
