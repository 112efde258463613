"""Model.logits against the transformers fixtures, the CLI's `mambacpp logits`, and itself (chunks, batches).

Tolerances: the fixtures were computed in float64 from the stored weights, mambacpp computes in float32; the C++
fixture test (tests/fixtures_test.cpp) measured 1.2e-7 to 5.1e-7 of the largest logit and uses 1e-5, which any
modelling error exceeds by 1e3x: the same here. Chunked and batched runs follow different summation orders in float32
(the chunked scan), so they also get 1e-5. The CLI runs the very same C++ forward on the same input, so it must agree
to float32 rounding of a different thread split at most: 1e-6.
"""

import numpy as np
import pytest

import mambacpp
from conftest import FIXTURES, cli_path, fixture_model_dirs, max_rel_diff, read_tokens, run_cli

TOL = 1e-5


@pytest.mark.parametrize("name", [p.name for p in fixture_model_dirs()])
def test_logits_match_transformers(fixture_models, name):
    model = fixture_models[name]
    d = FIXTURES / "models" / name
    ids = read_tokens(d / "tokens.txt")
    expected = np.load(d / "logits.npy")
    got = model.logits(ids)
    assert got.dtype == np.float32 and got.shape == expected.shape == (len(ids), model.vocab_size)
    assert max_rel_diff(got, expected) <= TOL


CHECKPOINTS = sorted(p for p in (FIXTURES / "checkpoints").glob("*") if (p / "logits.npy").exists())


@pytest.mark.parametrize("path", CHECKPOINTS, ids=[p.name for p in CHECKPOINTS])
def test_checkpoint_formats_match_transformers(path):
    # mamba_ssm directories with pytorch_model.bin (sharded, deflated) and FalconMamba: the same 1e-5 as
    # tests/checkpoint_formats_test.cpp.
    model = mambacpp.Model(path, device="cpu", threads=1)
    assert max_rel_diff(model.logits(read_tokens(path / "tokens.txt")), np.load(path / "logits.npy")) <= TOL


def test_checkpoint_fixtures_exist():
    assert len(CHECKPOINTS) >= 5


@pytest.mark.parametrize("name", [p.name for p in fixture_model_dirs() if (p / "inputs_embeds.npy").exists()])
def test_embeddings_match_transformers(fixture_models, name):
    model = fixture_models[name]
    d = FIXTURES / "models" / name
    emb = np.load(d / "inputs_embeds.npy").astype(np.float32)
    assert max_rel_diff(model.logits(embeddings=emb), np.load(d / "logits_embeds.npy")) <= TOL


def test_embeddings_fixtures_exist():
    # The parametrized test above must not pass by finding nothing: a Mamba-1 and a Mamba-2 fixture have embeddings.
    assert len([p for p in fixture_model_dirs() if (p / "inputs_embeds.npy").exists()]) >= 2


@pytest.mark.parametrize("name", [p.name for p in fixture_model_dirs()])
def test_chunks_with_state_equal_one_pass(fixture_models, name):
    model = fixture_models[name]
    ids = read_tokens(FIXTURES / "models" / name / "tokens.txt")
    whole = model.logits(ids)
    rng = np.random.default_rng(7)
    for _ in range(3):
        state = model.new_state()
        parts, at = [], 0
        while at < len(ids):
            n = int(rng.integers(1, 13))
            parts.append(model.logits(ids[at:at + n], state=state))
            at += n
        assert max_rel_diff(np.concatenate(parts), whole) <= TOL


def test_two_calls_continue_the_state(model):
    a = model.tokenizer.encode("def parse_args(argv):\n")
    b = model.tokenizer.encode("    parser = argparse.ArgumentParser()")
    state = model.new_state()
    first = model.logits(a, state=state)
    second = model.logits(b, state=state)
    whole = model.logits(a + b)
    assert max_rel_diff(np.concatenate([first, second]), whole) <= TOL
    # A fresh call does not see the state: the second chunk alone differs from its continuation.
    assert max_rel_diff(model.logits(b), second) > 1e-2


def test_batch_rows_equal_rows_alone(model):
    rng = np.random.default_rng(3)
    ids = rng.integers(0, model.vocab_size, size=(3, 19))
    batch = model.logits(ids)
    assert batch.shape == (3, 19, model.vocab_size)
    for b in range(3):
        assert max_rel_diff(batch[b], model.logits(ids[b])) <= TOL


def test_shapes_are_never_squeezed(model):
    v = model.vocab_size
    assert model.logits([5]).shape == (1, v)
    assert model.logits(np.array([[5]])).shape == (1, 1, v)
    assert model.logits([5, 6, 7], all_positions=False).shape == (v,)
    assert model.logits(np.array([[5, 6], [7, 8]]), all_positions=False).shape == (2, v)


def test_last_position_equals_last_row(model):
    ids = model.tokenizer.encode("import numpy as np")
    assert max_rel_diff(model.logits(ids, all_positions=False), model.logits(ids)[-1]) <= TOL


def test_integer_dtypes_and_lists_agree(model):
    ids = [11, 400, 3, 900]
    ref = model.logits(ids)
    for dt in (np.int32, np.int64, np.uint16, np.int16):
        np.testing.assert_array_equal(model.logits(np.array(ids, dtype=dt)), ref)


def test_float16_and_bfloat16_embeddings(fixture_models):
    model = fixture_models["mamba2_f32_groups_bias"]
    emb = np.load(FIXTURES / "models" / "mamba2_f32_groups_bias" / "inputs_embeds.npy").astype(np.float32)
    # float16: the engine converts on the fly, so it must equal float32 input holding the same rounded values.
    h = emb.astype(np.float16)
    assert max_rel_diff(model.logits(embeddings=h), model.logits(embeddings=h.astype(np.float32))) <= 1e-6
    # bfloat16 as uint16 bits: the upper half of each float32 (truncation gives exactly representable values).
    bits = (emb.view(np.uint32) >> 16).astype(np.uint16)
    as_f32 = (bits.astype(np.uint32) << 16).view(np.float32)
    assert max_rel_diff(model.logits(embeddings=bits), model.logits(embeddings=as_f32)) <= 1e-6


def test_dlpack_input(model):
    class Tensor:  # what torch CPU tensors offer: __dlpack__ and __dlpack_device__
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, stream=None):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    ids = np.array([3, 70, 800], dtype=np.int64)
    np.testing.assert_array_equal(model.logits(Tensor(ids)), model.logits(ids))


@pytest.mark.parametrize("chunks", [None, "2,10,1,32"])
def test_equals_cli_logits(tmp_path, fixture_models, chunks):
    name = "mamba1_f32_untied_bias"
    d = FIXTURES / "models" / name
    out = tmp_path / "logits.npy"
    args = ["logits", "--model", d, "--device", "cpu", "--tokens-file", d / "tokens.txt", "--out", out]
    run_cli(*(args + (["--chunks", chunks] if chunks else [])))
    assert max_rel_diff(fixture_models[name].logits(read_tokens(d / "tokens.txt")), np.load(out)) <= 1e-6


def test_the_gil_is_released_during_forward(model):
    # The main thread keeps running Python while another thread's forward runs: the longest pause it sees must be
    # far below the forward's duration (with the GIL held through the call it would be the whole duration).
    import threading
    import time
    ids = np.arange(1000) % model.vocab_size
    t0 = time.perf_counter()
    model.logits(ids, all_positions=False)
    duration = time.perf_counter() - t0
    worker = threading.Thread(target=model.logits, args=(ids,), kwargs={"all_positions": False})
    last, longest = time.perf_counter(), 0.0
    worker.start()
    while worker.is_alive():
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    worker.join()
    assert duration > 0.05, "the forward is too short to tell"
    assert longest < duration / 3, f"main thread paused {longest:.3f} s during a {duration:.3f} s forward"


@pytest.mark.gpu
def test_gpu_logits_match_transformers():
    d = FIXTURES / "models" / "mamba2_f32_groups_bias"
    model = mambacpp.Model(d, device="cuda", dtype="fp32")
    assert model.device == "cuda"
    ids = read_tokens(d / "tokens.txt")
    # Weights kept exactly (f32) on the device with an f32 state: 1e-4, as tests/gpu/model_gpu_test.cpp allows.
    assert max_rel_diff(model.logits(ids), np.load(d / "logits.npy")) <= 1e-4
