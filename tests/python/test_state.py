"""States: save/load/copy/reset round-trips and the conv/SSM arrays. Continuing a state must give the logits of one
pass (within 1e-5 of the largest logit, as in test_logits.py); a copied or reloaded state holds identical bytes, so
its continuation must equal the original's exactly."""

import numpy as np
import pytest

import mambacpp
from conftest import FIXTURES, max_rel_diff

TOL = 1e-5


def prompt(model):
    return model.tokenizer.encode("class Parser:\n    def __init__(self, text):\n")


def test_save_then_load_continues_exactly(model, tmp_path):
    a = prompt(model)
    b = model.tokenizer.encode("        self.text = text")
    state = model.new_state()
    model.logits(a, state=state)
    path = tmp_path / "s.state"
    state.save(path, tokens=a)
    expected = model.logits(b, state=state)
    loaded = model.load_state(path)
    assert loaded.tokens == a and loaded.batch == 1
    np.testing.assert_array_equal(model.logits(b, state=loaded), expected)
    assert max_rel_diff(expected, model.logits(a + b)[len(a):]) <= TOL


def test_copy_is_independent(model):
    a = prompt(model)
    state = model.new_state()
    model.logits(a, state=state)
    fork = state.copy()
    x = model.logits([40, 41], state=state)
    np.testing.assert_array_equal(model.logits([40, 41], state=fork), x)
    # Advancing the original did not move the fork, and the other way round.
    y = model.logits([7], state=state)
    z = model.logits([7], state=fork)
    np.testing.assert_array_equal(y, z)


def test_reset_is_a_fresh_state(model):
    state = model.new_state(2)
    ids = np.array([prompt(model)[:5], prompt(model)[5:10]])
    model.logits(ids, state=state)
    state.reset(row=1)
    for conv, ssm in state.arrays():
        assert not conv[1].any() and not ssm[1].any()
        assert conv[0].any() and ssm[0].any()
    np.testing.assert_array_equal(model.logits(ids[1:], state=model.new_state())[0],
                                  model.logits(ids, state=state)[1])
    state.reset()
    assert all(not c.any() and not s.any() for c, s in state.arrays())


def test_arrays_have_the_config_shapes(model, fixture_models):
    for m in [model, fixture_models["mamba1_f32_untied_bias"]]:
        c = m.config
        state = m.new_state(3)
        arrays = state.arrays()
        assert len(arrays) == c["n_layer"]
        conv_channels = c["d_inner"] if c["arch"] == "mamba" else c["d_inner"] + 2 * c["n_groups"] * c["d_state"]
        ssm_shape = (3, c["d_inner"], c["d_state"]) if c["arch"] == "mamba" else \
            (3, c["n_heads"], c["head_dim"], c["d_state"])
        for conv, ssm in arrays:
            assert conv.shape == (3, conv_channels, c["d_conv"] - 1) and conv.dtype == np.float32
            assert ssm.shape == ssm_shape
        assert state.conv(0).shape == arrays[0][0].shape
        assert state.nbytes == 3 * 4 * c["n_layer"] * (conv_channels * (c["d_conv"] - 1) + int(np.prod(ssm_shape[1:])))


def test_conv_state_holds_the_last_inputs(fixture_models):
    # The conv state is the last d_conv - 1 conv inputs: after 1 token only the newest column is set.
    m = fixture_models["mamba1_f32_untied_bias"]
    state = m.new_state()
    m.logits([3], state=state)
    conv = state.conv(0)[0]
    assert not conv[:, :-1].any() and conv[:, -1].any()


def test_load_rejects_another_models_state(model, fixture_models, tmp_path):
    other = fixture_models["mamba2_f32_groups_bias"]
    s = other.new_state()
    other.logits([1, 2, 3], state=s)
    path = tmp_path / "other.state"
    s.save(path)
    with pytest.raises(mambacpp.FileError) as e:
        model.load_state(path)
    assert isinstance(e.value, OSError) and str(path) in str(e.value)


def test_load_of_a_missing_or_corrupt_file(model, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        model.load_state(tmp_path / "nope.state")
    bad = tmp_path / "bad.state"
    bad.write_bytes(b"not a state file at all")
    with pytest.raises(mambacpp.FileError):
        model.load_state(bad)


def test_rows_of_a_batch_save_separately(model, tmp_path):
    ids = np.array([prompt(model)[:5], prompt(model)[5:10]])
    state = model.new_state(2)
    model.logits(ids, state=state)
    state.save(tmp_path / "row1.state", row=1)
    loaded = model.load_state(tmp_path / "row1.state")
    for (c, s), (c2, s2) in zip(state.arrays(), loaded.arrays()):
        np.testing.assert_array_equal(c[1], c2[0])
        np.testing.assert_array_equal(s[1], s2[0])


def test_state_survives_its_model_object(tmp_path):
    # A State keeps the C++ model alive: dropping the Python Model first must not crash.
    m = mambacpp.Model(FIXTURES / "models" / "mamba1_bf16_tied", device="cpu", threads=1)
    s = m.new_state()
    ref = m.logits([1, 2], state=s.copy())
    block = m.block(0)
    del m
    import gc
    gc.collect()
    assert s.arrays()[0][0].shape[0] == 1 and ref.shape[0] == 2
    y, _ = block(np.ones((2, block.model.d_model), dtype=np.float32))
    assert np.isfinite(y).all()


def test_tokens_follow_what_was_fed_and_serve_the_engine(model, tmp_path):
    a = prompt(model)
    state = model.new_state()
    model.logits(a[:4], state=state)
    model.logits(a[4:], state=state)
    assert state.tokens == a and state.copy().tokens == a
    state.save(tmp_path / "a.state")
    assert model.load_state(tmp_path / "a.state").tokens == a
    # The engine continues from the file: only the new tokens are prefilled, and the result is a fresh run's.
    engine = mambacpp.Engine(model, state_cache_mb=64)
    assert engine.load_state(tmp_path / "a.state") == a
    cont = a + model.tokenizer.encode("        self.pos = 0\n")
    r = engine.run([cont], max_tokens=8, temperature=0)[0]
    assert r.cached_prompt_tokens == len(a)
    assert r.tokens == mambacpp.Engine(model, state_cache_mb=0).run([cont], max_tokens=8, temperature=0)[0].tokens
    # Embeddings make the tokens unknown for good (until reset).
    model.logits(embeddings=np.zeros((1, model.d_model), np.float32), state=state)
    model.logits([5], state=state)
    assert state.tokens == []
    state.reset()
    model.logits([5], state=state)
    assert state.tokens == [5]


def test_a_state_is_used_by_one_thread_at_a_time(model):
    # Several threads feeding one state: the calls serialise (no torn state), so the result is some order of the
    # same chunks; with equal chunks every order gives the same state, and so the one-pass logits.
    import threading
    chunk = prompt(model)[:6]
    state = model.new_state()
    threads = [threading.Thread(target=model.logits, args=(chunk,), kwargs={"state": state}) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    last = model.logits([3], state=state)
    assert max_rel_diff(last[0], model.logits(chunk * 4 + [3])[-1]) <= TOL
