"""Shared fixtures of the Python tests. They import the mambacpp package from PYTHONPATH (the build tree's
build/python, as ctest sets it) or from an installed copy, and run the CLI from $MAMBACPP_CLI (ctest sets it) or
build/mambacpp."""

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

import mambacpp

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
DEFAULT_MODEL = ROOT / "models" / "default"
# One CPU thread for the models and the CLI alike: CI machines have 2 cores shared with other jobs, where OpenMP
# barriers over oversubscribed cores cost 100x; and the same thread split on both sides makes their sums identical.
THREADS = int(os.environ.get("MAMBACPP_TEST_THREADS", "1"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (ctest label gpu)")


def fixture_model_dirs():
    dirs = sorted(p for p in (FIXTURES / "models").iterdir() if (p / "logits.npy").exists())
    assert len(dirs) >= 5, f"expected the transformers fixtures under {FIXTURES / 'models'}"
    return dirs


def read_tokens(path):
    return [int(t) for t in pathlib.Path(path).read_text().split()]


def max_rel_diff(got, expected):
    """max |got - expected| / max |expected|, as the C++ tests compute it (tests/support/test_support.cpp)."""
    got = np.asarray(got, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape, f"shape {got.shape} != {expected.shape}"
    assert np.isfinite(got).all() and np.isfinite(expected).all()
    return float(np.max(np.abs(got - expected)) / np.max(np.abs(expected)))


def cli_path():
    path = os.environ.get("MAMBACPP_CLI") or str(ROOT / "build" / "mambacpp")
    if not os.path.exists(path):
        pytest.fail(f"the mambacpp binary is needed for this test: build it or set MAMBACPP_CLI (looked at {path})")
    return path


def run_cli(*args):
    args = [*args, "--threads", THREADS] if args and args[0] in ("generate", "logits") else args
    r = subprocess.run([cli_path(), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"mambacpp {' '.join(map(str, args))} failed: {r.stderr}"
    return r.stdout


@pytest.fixture(scope="session")
def model():
    """The shipped model on the CPU."""
    return mambacpp.Model(device="cpu", threads=THREADS)


@pytest.fixture(scope="session")
def fixture_models():
    return {p.name: mambacpp.Model(p, device="cpu", threads=THREADS) for p in fixture_model_dirs()}


def load_json(path):
    with open(path) as f:
        return json.load(f)


def read_safetensors(path):
    """Every tensor of a .safetensors file as a numpy array (F32 as stored; BF16 and F16 widened to float32)."""
    import struct
    data = pathlib.Path(path).read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, t in header.items():
        begin, end = t["data_offsets"]
        raw = data[8 + n + begin:8 + n + end]
        if t["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif t["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif t["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: {name} has dtype {t['dtype']}")
        out[name] = a.reshape(t["shape"])
    return out
