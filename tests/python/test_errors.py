"""Bad input raises a mambacpp exception that names the argument, what was expected and what was found; never a
crash. InvalidArgumentError is a ValueError, FileError an OSError, MissingFileError a FileNotFoundError, and all of
them are mambacpp.Error (a RuntimeError)."""

import numpy as np
import pytest

import mambacpp
from mambacpp._mambacpp import _Model
from conftest import FIXTURES


def test_hierarchy():
    assert issubclass(mambacpp.Error, RuntimeError)
    assert issubclass(mambacpp.InvalidArgumentError, (mambacpp.Error, ValueError))
    assert issubclass(mambacpp.InvalidArgumentError, ValueError)
    assert issubclass(mambacpp.FileError, OSError) and issubclass(mambacpp.FileError, mambacpp.Error)
    assert issubclass(mambacpp.MissingFileError, FileNotFoundError)


@pytest.mark.parametrize("ids, message", [
    ([1.0, 2.0], "ids: expected integer token ids, found dtype float64"),
    ([], "ids: expected at least one token id, found none"),
    (np.zeros((1, 2, 3), dtype=np.int32), "ids: expected a list or 1-D array [L], or a 2-D array [B, L], found 3 "
                                         "dimensions"),
    ([5, -1, 3], "ids: expected token ids in [0, 4096), found -1 at index 1"),
    ([5, 4096], "ids: expected token ids in [0, 4096), found 4096 at index 1"),
    (np.array([[1, 2], [3, 2**40]]), "ids: expected token ids in [0, 4096), found 1099511627776 at index (1, 1)"),
    ([[1, 2], [3]], "ids: expected a rectangular array"),
    ([True, False], "ids: expected integer token ids, found dtype bool"),
])
def test_bad_ids(model, ids, message):
    with pytest.raises(mambacpp.InvalidArgumentError) as e:
        model.logits(ids)
    assert message in str(e.value)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("emb, message", [
    (np.zeros((3, 255), np.float32), "embeddings: expected shape [L >= 1, 256] (d_model = 256), found [3, 255]"),
    (np.zeros((3, 256), np.float64), "embeddings: expected dtype float32 or float16 (or uint16 holding bfloat16 bits), "
                                     "found float64"),
    (np.zeros((256,), np.float32), "embeddings: expected [L, 256] or [B, L, 256] (d_model = 256), found 1 dimensions"),
    (np.zeros((2, 0, 256), np.float32), "embeddings: expected shape [B >= 1, L >= 1, 256]"),
])
def test_bad_embeddings(model, emb, message):
    with pytest.raises(mambacpp.InvalidArgumentError) as e:
        model.logits(embeddings=emb)
    assert message in str(e.value)


def test_ids_and_embeddings_together_or_neither(model):
    with pytest.raises(mambacpp.InvalidArgumentError, match="exactly one of ids or embeddings"):
        model.logits()
    with pytest.raises(mambacpp.InvalidArgumentError, match="exactly one of ids or embeddings"):
        model.logits([1], embeddings=np.zeros((1, 256), np.float32))


def test_bad_states(model, fixture_models):
    with pytest.raises(mambacpp.InvalidArgumentError, match=r"state: holds 2 sequences, expected 1 \(the input's B\)"):
        model.logits([1, 2], state=model.new_state(2))
    with pytest.raises(mambacpp.InvalidArgumentError, match="state: it belongs to another model"):
        model.logits([1, 2], state=fixture_models["mamba1_bf16_tied"].new_state())
    with pytest.raises(mambacpp.InvalidArgumentError, match="state: expected a mambacpp.State, found dict"):
        model.logits([1], state={})
    with pytest.raises(mambacpp.InvalidArgumentError, match="batch: expected 1 <= batch, found 0"):
        model.new_state(0)
    with pytest.raises(mambacpp.InvalidArgumentError, match="row"):
        model.new_state(2).reset(row=2)
    with pytest.raises(mambacpp.InvalidArgumentError, match="row"):
        model.new_state(1).save("/tmp/never-written.state", row=5)


def test_a_failed_call_leaves_the_state_alone(model):
    state = model.new_state()
    model.logits([10, 20], state=state)
    before = state.arrays()
    with pytest.raises(mambacpp.InvalidArgumentError):
        model.logits([10, 99999], state=state)
    for (c, s), (c2, s2) in zip(before, state.arrays()):
        np.testing.assert_array_equal(c, c2)
        np.testing.assert_array_equal(s, s2)


def test_bad_model_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="path: model directory or .gguf file '/no/such/dir' does not exist"):
        mambacpp.Model("/no/such/dir")
    with pytest.raises(mambacpp.FileError) as e:  # a directory that holds no checkpoint: the C++ message
        mambacpp.Model(tmp_path)
    assert str(tmp_path) in str(e.value)
    with pytest.raises(mambacpp.InvalidArgumentError, match="tpu"):
        mambacpp.Model(FIXTURES / "models" / "mamba1_bf16_tied", device="tpu")
    with pytest.raises(mambacpp.InvalidArgumentError, match="threads: expected 0 <= threads <= 1024, found -2"):
        mambacpp.Model(FIXTURES / "models" / "mamba1_bf16_tied", threads=-2)
    with pytest.raises(mambacpp.InvalidArgumentError, match="threads: expected 0 <= threads <= 1024, found 100000"):
        mambacpp.Model(FIXTURES / "models" / "mamba1_bf16_tied", device="cpu", threads=100000)
    with pytest.raises(mambacpp.InvalidArgumentError, match="threads: expected 0 .* to 1024, found 100000"):
        _Model(str(FIXTURES / "models" / "mamba1_bf16_tied"), "cpu", "", 100000, 2048, True, "fast")  # no Python check
    with pytest.raises(mambacpp.InvalidArgumentError, match="dtype"):
        mambacpp.Model(FIXTURES / "models" / "mamba1_bf16_tied", device="cpu", dtype="int8")


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=float("nan")), "sampling: temperature must be a number, found NaN"),
    (dict(top_p=float("nan")), "sampling: top_p must be a number, found NaN"),
    (dict(repeat_penalty=0), "sampling: repeat_penalty must be a finite number > 0, found 0"),
    (dict(presence_penalty=3), "sampling: presence_penalty must be in [-2, 2], found 3"),
    (dict(max_tokens=-1), "max_tokens: expected 0 <= max_tokens"),
    (dict(max_tokens=2.5), "max_tokens: expected an integer, found float 2.5"),
    (dict(seed=-3), "seed: expected 0 <= seed"),
    (dict(stop=[1]), "stop: expected a str or a list of str"),
    (dict(logprobs=50), "logprobs: expected 0 <= logprobs <= 20, found 50"),
    (dict(temperature="hot"), "temperature: expected a number, found str 'hot'"),
])
def test_bad_generate_arguments(model, kwargs, message):
    with pytest.raises(mambacpp.InvalidArgumentError) as e:
        model.generate("x = ", **kwargs)
    assert message in str(e.value)


def test_bad_prompts(model):
    with pytest.raises(mambacpp.InvalidArgumentError, match="prompt: expected at least one token"):
        model.generate("")
    with pytest.raises(mambacpp.InvalidArgumentError, match=r"prompt: expected token ids in \[0, 4096\), found 5000"):
        model.generate([1, 5000])
    with pytest.raises(mambacpp.InvalidArgumentError, match="prompt: expected a list or 1-D array"):
        model.generate(np.zeros((2, 2), np.int64))


def test_engine_refuses_beyond_its_limits(model):
    engine = mambacpp.Engine(model, max_queue=1, max_seqs=1, max_prompt=4)
    with pytest.raises(mambacpp.InvalidArgumentError) as e:
        engine.submit([1, 2, 3, 4, 5])
    assert "prompt" in str(e.value)
    engine.submit([1], max_tokens=1)  # waits in the queue until the next step
    with pytest.raises(mambacpp.InvalidArgumentError, match="the queue is full"):
        engine.submit([1], max_tokens=1)


def test_engine_slots_that_cannot_fit_are_refused_before_allocating(model):
    # Slots are allocated up front: 2^40 of them would take far more than any machine's memory.
    with pytest.raises(mambacpp.Error, match="state slots"):
        mambacpp.Engine(model, max_seqs=2**40)


def test_tokenizer_errors(model):
    assert model.tokenizer.decode([300, 10**6, -5]) == model.tokenizer.decode([300])  # unknown ids vanish, as in HF
    with pytest.raises(mambacpp.InvalidArgumentError, match="ids: expected 32-bit token ids, found 1099511627776"):
        model.tokenizer.decode([1, 2**40])
    with pytest.raises(mambacpp.InvalidArgumentError, match="ids: expected integer token ids, found dtype float64"):
        model.tokenizer.decode([1.5])
    with pytest.raises(mambacpp.InvalidArgumentError, match="text: expected a str, found bytes"):
        model.tokenizer.encode(b"abc")
    with pytest.raises(FileNotFoundError):
        mambacpp.Tokenizer("/no/tokenizer.json")


def test_block_errors(model):
    with pytest.raises(mambacpp.InvalidArgumentError, match=r"layer: expected 0 <= layer <= 7, found 8"):
        model.block(8)
    block = model.block(0)
    with pytest.raises(mambacpp.InvalidArgumentError, match="x: expected dtype float32, found float16"):
        block(np.zeros((2, 256), np.float16))
    with pytest.raises(mambacpp.InvalidArgumentError, match="state: expected a State made by this block"):
        block(np.zeros((2, 256), np.float32), model.new_state())


def test_native_module_checks_too(model):
    # The native layer is reachable (mambacpp._mambacpp); it must refuse bad arrays, not crash.
    native = model._native
    with pytest.raises(mambacpp.InvalidArgumentError, match="embeddings: expected 3 dimensions, found 1"):
        native.forward(model.new_state()._native, np.zeros(256, np.float32), True)
    with pytest.raises(mambacpp.InvalidArgumentError, match="expected a C-contiguous array"):
        native.forward(model.new_state(2)._native, np.zeros((4, 3), np.int32)[::2], True)
    with pytest.raises(mambacpp.InvalidArgumentError, match="found dtype float64"):
        native.forward(model.new_state()._native, np.zeros((1, 2), np.float64), True)
    with pytest.raises(mambacpp.InvalidArgumentError):
        native.forward(model.new_state()._native, np.array([[1, 99999]], np.int32), True)


def test_bad_precision():
    with pytest.raises(mambacpp.InvalidArgumentError, match="precision: expected 'fast' or 'exact', found 'medium'"):
        mambacpp.Model(device="cpu", precision="medium")
    assert mambacpp.Model(device="cpu", precision="exact").device == "cpu"  # the CPU computes in f32 either way
