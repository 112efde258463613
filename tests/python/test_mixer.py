"""Mamba2Mixer / MambaMixer (the mixer alone, as mamba_ssm computes it) against the models they come from.

The strongest check: the transformers fixtures' logits rebuilt in numpy from the mixers alone, x <- x +
mixer_i(rmsnorm(x) * w_i) per layer, then norm_f and the LM head (float64 numpy around float32 mixers): this is the
model's own computation, so the fixtures' tolerance applies (1e-5 of the largest logit; the C++ fixture test measured
~5e-7). A mixer binds the C++ mixer (include/mambacpp/mixer.h), the model's own mixer code, so the same 1e-5 bound holds
for mixer vs block(x) - x, and for chunks and steps vs one call.
"""

import numpy as np
import pytest

import mambacpp
from conftest import FIXTURES, fixture_model_dirs, max_rel_diff, read_safetensors, read_tokens

TOL = 1e-5


def mixer_class(model):
    return mambacpp.Mamba2Mixer if model.config["arch"] == "mamba2" else mambacpp.MambaMixer


def rmsnorm(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("name", [p.name for p in fixture_model_dirs()])
def test_mixers_rebuild_the_transformers_logits(fixture_models, name):
    model = fixture_models[name]
    d = FIXTURES / "models" / name
    w = {}
    for f in sorted(d.glob("*.safetensors")):
        w.update(read_safetensors(f))
    eps = model.config["norm_eps"]
    ids = read_tokens(d / "tokens.txt")
    x = w["backbone.embeddings.weight"][ids].astype(np.float64)
    for layer in range(model.n_layer):
        mixer = mixer_class(model).from_model(model, layer, threads=1)
        y, _ = mixer(rmsnorm(x, w[f"backbone.layers.{layer}.norm.weight"], eps).astype(np.float32))
        x = x + y
    h = rmsnorm(x, w["backbone.norm_f.weight"], eps)
    head = w.get("lm_head.weight", w["backbone.embeddings.weight"]).astype(np.float64)
    assert max_rel_diff(h @ head.T, np.load(d / "logits.npy")) <= TOL


@pytest.mark.parametrize("name", ["mamba1_f32_untied_bias", "mamba2_f32_groups_bias"])
def test_mixer_is_the_block_without_norm_and_residual(fixture_models, name):
    model = fixture_models[name]
    w = read_safetensors(FIXTURES / "models" / name / "model.safetensors")
    x = np.random.default_rng(4).standard_normal((2, 17, model.d_model)).astype(np.float32)
    block_out, _ = model.block(1)(x)
    u = rmsnorm(x, w["backbone.layers.1.norm.weight"], model.config["norm_eps"]).astype(np.float32)
    y, _ = mixer_class(model).from_model(model, 1, threads=1)(u)
    assert max_rel_diff(y, block_out.astype(np.float64) - x) <= TOL


@pytest.mark.parametrize("name", ["mamba1_f32_untied_bias", "mamba2_f32_groups_bias"])
def test_chunks_with_a_state_equal_one_call(fixture_models, name):
    model = fixture_models[name]
    mixer = mixer_class(model).from_model(model, 0, threads=1)
    x = np.random.default_rng(5).standard_normal((3, 20, model.d_model)).astype(np.float32)
    whole, _ = mixer(x)
    state = mixer.new_state(3)
    parts = []
    for a, b in [(0, 3), (3, 4), (4, 20)]:
        y, state = mixer(x[:, a:b], state)
        parts.append(y)
    assert max_rel_diff(np.concatenate(parts, axis=1), whole) <= TOL


def test_from_a_dict_of_mamba_ssm_weights(fixture_models):
    name = "mamba2_f32_groups_bias"  # n_groups = 3
    model = fixture_models[name]
    w = read_safetensors(FIXTURES / "models" / name / "model.safetensors")
    prefix = "backbone.layers.0.mixer."
    weights = {k[len(prefix):]: v.astype(np.float64) for k, v in w.items() if k.startswith(prefix)}
    x = np.random.default_rng(6).standard_normal((9, model.d_model)).astype(np.float32)
    ref, _ = mambacpp.Mamba2Mixer.from_model(model, 0, threads=1)(x)
    y, _ = mambacpp.Mamba2Mixer(weights, n_groups=3, chunk_size=model.config["chunk_size"], threads=1)(x)
    np.testing.assert_array_equal(y, ref)
    # n_groups cannot be read from the shapes (mamba_ssm takes it as an argument too), and it matters:
    wrong, _ = mambacpp.Mamba2Mixer(weights, threads=1)(x)
    assert max_rel_diff(wrong, ref) > 1e-3


def test_mixer_errors(fixture_models):
    w = read_safetensors(FIXTURES / "models" / "mamba1_f32_untied_bias" / "model.safetensors")
    prefix = "backbone.layers.0.mixer."
    weights = {k[len(prefix):]: v for k, v in w.items() if k.startswith(prefix)}
    with pytest.raises(mambacpp.InvalidArgumentError, match="weights: missing 'A_log' for a MambaMixer"):
        mambacpp.MambaMixer({k: v for k, v in weights.items() if k != "A_log"})
    with pytest.raises(mambacpp.InvalidArgumentError, match="weights: unexpected 'norm.weight' for a MambaMixer"):
        mambacpp.MambaMixer({**weights, "norm.weight": np.ones(80, np.float32)})
    with pytest.raises(mambacpp.InvalidArgumentError, match=r"weights\['D'\]: expected a float array, found dtype int64"):
        mambacpp.MambaMixer({**weights, "D": np.ones(80, np.int64)})
    # The C++ mixer's shape check names the weight, the expected and the found shape.
    with pytest.raises(mambacpp.InvalidArgumentError,
                       match=r"MambaMixer weight 'out_proj.weight': expected f32, f16 or bf16 of shape \[40, 80\], "
                             r"found f32 \[40, 81\]"):
        mambacpp.MambaMixer({**weights, "out_proj.weight": np.ones((40, 81), np.float32)})
    with pytest.raises(mambacpp.InvalidArgumentError, match="model: a mamba model has no Mamba2Mixer layers"):
        mambacpp.Mamba2Mixer.from_model(fixture_models["mamba1_f32_untied_bias"], 0)
    mixer = mambacpp.MambaMixer(weights)
    with pytest.raises(mambacpp.InvalidArgumentError, match="state: expected a State made by this mixer's new_state"):
        mixer(np.zeros((2, 40), np.float32), mambacpp.MambaMixer(weights).new_state())
    with pytest.raises(mambacpp.InvalidArgumentError, match="state: holds 2 sequences, expected 1"):
        mixer(np.zeros((2, 40), np.float32), mixer.new_state(2))
    with pytest.raises(mambacpp.InvalidArgumentError, match="save: a mixer's state cannot be saved"):
        mixer.new_state().save("unused.state")
    with pytest.raises(mambacpp.InvalidArgumentError, match=r"x: expected shape \[L >= 1, 40\]"):
        mixer(np.zeros((2, 41), np.float32))


@pytest.mark.parametrize("name", ["mamba1_f32_untied_bias", "mamba2_f32_groups_bias"])
def test_steps_equal_one_call(fixture_models, name):
    model = fixture_models[name]
    mixer = mixer_class(model).from_model(model, 1, threads=1)
    x = np.random.default_rng(8).standard_normal((2, 11, model.d_model)).astype(np.float32)
    whole, whole_state = mixer(x)
    state = mixer.new_state(2)
    steps = [mixer.step(x[:, t], state)[0] for t in range(x.shape[1])]
    assert max_rel_diff(np.stack(steps, axis=1), whole) <= TOL
    for (c1, s1), (c2, s2) in zip(state.arrays(), whole_state.arrays()):
        assert max_rel_diff(c1, c2) <= TOL and max_rel_diff(s1, s2) <= TOL
    y1, _ = mixer.step(x[0, 0])  # one row: [d_model] in, [d_model] out
    assert y1.shape == (model.d_model,) and max_rel_diff(y1, whole[0, 0]) <= TOL


def test_float16_weights_are_their_values(fixture_models):
    w = read_safetensors(FIXTURES / "models" / "mamba2_f32_groups_bias" / "model.safetensors")
    prefix = "backbone.layers.0.mixer."
    half = {k[len(prefix):]: v.astype(np.float16) for k, v in w.items() if k.startswith(prefix)}
    x = np.random.default_rng(9).standard_normal((7, fixture_models["mamba2_f32_groups_bias"].d_model)).astype(np.float32)
    y16, _ = mambacpp.Mamba2Mixer(half, n_groups=3, threads=1)(x)
    y32, _ = mambacpp.Mamba2Mixer({k: v.astype(np.float32) for k, v in half.items()}, n_groups=3, threads=1)(x)
    assert max_rel_diff(y16, y32) <= 1e-6


def test_no_import_circle():
    # mambacpp._model imports _mixer and _block (Model.mixer, Model.block); they import nothing of it back.
    import ast
    import inspect
    import mambacpp._block
    import mambacpp._mixer
    for mod in (mambacpp._mixer, mambacpp._block):
        tree = ast.parse(inspect.getsource(mod))
        names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "_model" not in names, mod.__name__


def test_falcon_mamba_mixers_rebuild_the_transformers_logits():
    # FalconMamba: Mamba-1 with unweighted RMS norms on dt, B and C inside the mixer (mixer_rms_eps).
    d = FIXTURES / "checkpoints" / "falcon_mamba_bf16_tied"
    model = mambacpp.Model(d, device="cpu", threads=1)
    assert model.config["mixer_rms_eps"] > 0
    w = read_safetensors(d / "model.safetensors")
    eps = model.config["norm_eps"]
    x = w["backbone.embeddings.weight"][read_tokens(d / "tokens.txt")].astype(np.float64)
    for layer in range(model.n_layer):
        y, _ = model.mixer(layer, threads=1)(rmsnorm(x, w[f"backbone.layers.{layer}.norm.weight"], eps).astype(np.float32))
        x = x + y
    h = rmsnorm(x, w["backbone.norm_f.weight"], eps)
    assert max_rel_diff(h @ w["backbone.embeddings.weight"].astype(np.float64).T, np.load(d / "logits.npy")) <= TOL


def test_from_model_needs_safetensors():
    model = mambacpp.Model(FIXTURES / "checkpoints" / "mamba2_ssm_bf16_tied", device="cpu", threads=1)
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        model.mixer(0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["mamba1_f32_untied_bias", "mamba2_f32_groups_bias"])
def test_gpu_mixer_matches_the_cpu_mixer(fixture_models, name):
    model = fixture_models[name]
    cpu = mixer_class(model).from_model(model, 1, threads=1)
    gpu = mixer_class(model).from_model(model, 1, device="cuda")
    assert gpu.device == "cuda"
    x = np.random.default_rng(12).standard_normal((2, 21, model.d_model)).astype(np.float32)
    want, _ = cpu(x)
    got, state = gpu(x[:, :13])
    rest = [gpu.step(x[:, t], state)[0] for t in range(13, 21)]
    # f32 weights on the device (the mixer's default) with an f32 state: 1e-4, as test_gpu_logits_match_transformers.
    assert max_rel_diff(np.concatenate([got, np.stack(rest, axis=1)], axis=1), want) <= 1e-4
