"""mamba.cpp from Python: exact, stateful Mamba-1/Mamba-2 inference with numpy in and out.

    import mambacpp
    model = mambacpp.Model()                       # the shipped model; Model("path/to/checkpoint") for others
    print(model.generate("def parse_args(", max_tokens=32, temperature=0))
    logits = model.logits(model.tokenizer.encode("import os"))   # float32 [L, vocab]
"""

from ._errors import Error, FileError, InvalidArgumentError, MissingFileError
from ._mambacpp import GeneratedToken, GenerateResult, RequestEvent, TokenLogprob
from ._tokenizer import Tokenizer
from ._state import State
from ._model import Model, default_model_dir
from ._engine import Engine, TextStream
from ._block import MambaBlock
from ._mixer import Mamba2Mixer, MambaMixer

__version__ = "0.1.0"

__all__ = ["Model", "State", "Tokenizer", "Engine", "TextStream", "MambaBlock", "Mamba2Mixer", "MambaMixer", "GenerateResult", "GeneratedToken", "TokenLogprob",
           "RequestEvent", "Error", "InvalidArgumentError", "FileError", "MissingFileError", "default_model_dir"]
