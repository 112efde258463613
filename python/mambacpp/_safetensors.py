"""Just enough safetensors for the mixer layers: read one checkpoint's tensors by name (single file or sharded)."""

import json
import os
import struct

import numpy as np

from ._errors import FileError, MissingFileError

_READ_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8"}


def _header(path):
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise FileError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        n = struct.unpack("<Q", raw)[0]
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise FileError(f"{path}: not a safetensors file (header: {e})") from None
    header.pop("__metadata__", None)
    return header, 8 + n


def _files(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return sorted({os.path.join(model_dir, v) for v in weight_map.values()})
    single = os.path.join(model_dir, "model.safetensors")
    if not os.path.exists(single):
        raise MissingFileError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")
    return [single]


def read_tensors(model_dir, prefix):
    """Every tensor whose name starts with `prefix`, as float32 numpy arrays keyed by the rest of the name."""
    out = {}
    for path in _files(model_dir):
        header, start = _header(path)
        data = None
        for name, t in header.items():
            if not name.startswith(prefix):
                continue
            if data is None:
                data = np.memmap(path, dtype=np.uint8, mode="r")
            begin, end = t["data_offsets"]
            raw = data[start + begin:start + end]
            if t["dtype"] == "BF16":
                a = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
            elif t["dtype"] in _READ_DTYPES:
                a = raw.view(_READ_DTYPES[t["dtype"]]).astype(np.float32)
            else:
                raise FileError(f"{path}: tensor '{name}' has dtype {t['dtype']}, expected a float type")
            out[name[len(prefix):]] = a.reshape(t["shape"])
    return out

