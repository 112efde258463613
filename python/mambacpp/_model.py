"""Model: a loaded checkpoint: logits over numpy input, states, text generation."""

import json
import os
import threading
import types

from . import _checks
from ._errors import Error, InvalidArgumentError, MissingFileError
from ._mambacpp import MAX_THREADS as _MAX_THREADS, _Model, _load_chat_template
from ._mambacpp import default_model_dir as _native_default_model_dir
from ._state import State
from ._tokenizer import Tokenizer


def default_model_dir():
    """The shipped model: the package's copy when installed, else where the C++ library finds it
    ($MAMBACPP_MODEL, the source tree, the installed data dir)."""
    env = os.environ.get("MAMBACPP_MODEL")
    packaged = os.path.join(os.path.dirname(__file__), "models", "default")
    if not env and os.path.isfile(os.path.join(packaged, "config.json")):
        return packaged
    return _native_default_model_dir()


def _config_dict(text):
    """The C++ canonical config JSON as a dict: {"__float__": "Infinity"} becomes float("inf")."""
    def value(v):
        return float(v["__float__"]) if isinstance(v, dict) and set(v) == {"__float__"} else v
    config = {k: value(v) for k, v in json.loads(text).items()}
    config.pop("mambacpp_config", None)  # the format version of the canonical JSON
    return config


class Model:
    """A Mamba-1 or Mamba-2 checkpoint directory (config.json + safetensors, and tokenizer.json when present).

    ``path=None`` loads the shipped model. ``device``: "auto" (the GPU when usable), "cpu" or "cuda". ``dtype``:
    the weights' dtype on the GPU ("bf16", "fp16", "fp32"; None: bf16); the CPU keeps the stored dtype.
    ``threads``: CPU threads (0: all; at most 1024). ``batch_tokens``: prefill runs in pieces of at most this many tokens
    (0: 8192 on the GPU, 2048 on the CPU).
    ``precision``: how 16-bit weights meet the activations on the GPU, "fast" (activations rounded to the weight
    dtype, one tensor-core product) or "exact" (as accurate as f32); the README's "GPU precision modes".
    """

    def __init__(self, path=None, device="auto", dtype=None, threads=0, *, batch_tokens=0, cuda_graphs=True,
                 precision="fast"):
        path = default_model_dir() if path is None else os.fspath(path)
        if not (os.path.isdir(path) or (path.endswith(".gguf") and os.path.isfile(path))):
            raise MissingFileError(f"path: model directory or .gguf file '{path}' does not exist")
        if not isinstance(device, str):
            raise InvalidArgumentError(f"device: expected 'auto', 'cpu' or 'cuda', found {device!r}")
        if dtype is not None and not isinstance(dtype, str):
            raise InvalidArgumentError(f"dtype: expected None, 'bf16', 'fp16' or 'fp32', found {dtype!r}")
        if precision not in ("fast", "exact"):
            raise InvalidArgumentError(f"precision: expected 'fast' or 'exact', found {precision!r}")
        threads = _checks.integer(threads, "threads", 0, _MAX_THREADS)
        batch_tokens = _checks.integer(batch_tokens, "batch_tokens", 0)
        self._native = _Model(path, device, dtype or "", threads, batch_tokens, bool(cuda_graphs), precision)
        self._config = types.MappingProxyType(_config_dict(self._native.config_json))
        tok = os.path.join(path, "tokenizer.json")
        self.tokenizer = Tokenizer(tok) if os.path.isfile(tok) else None
        self._engine = None
        self._engine_lock = threading.Lock()
        self._chat_template = None  # loaded at the first chat call; False: the model has none

    # ---- what it is ----------------------------------------------------------------------------------------------
    @property
    def config(self):
        """The hyper-parameters (read-only dict: arch, d_model, n_layer, vocab_size, d_state, ...)."""
        return self._config

    @property
    def path(self):
        return self._native.directory

    @property
    def device(self):
        """"cpu" or "cuda"."""
        return self._native.device

    @property
    def device_description(self):
        return self._native.device_description

    @property
    def vocab_size(self):
        """Logit rows per position (the embedding matrix's rows)."""
        return self._config["vocab_size"]

    @property
    def d_model(self):
        return self._config["d_model"]

    @property
    def n_layer(self):
        return self._config["n_layer"]

    @property
    def weights_hash(self):
        """A 64-bit hash of every weight byte and the config (state files carry it)."""
        return self._native.weights_hash

    def __repr__(self):
        return f"Model('{self.path}', arch='{self._config['arch']}', device='{self.device}')"

    # ---- forward ---------------------------------------------------------------------------------------------
    def logits(self, ids=None, *, embeddings=None, state=None, all_positions=True):
        """Logits as float32 numpy: ids ``[L]`` (a list or 1-D array) -> ``[L, V]``, ids ``[B, L]`` -> ``[B, L, V]``;
        or ``embeddings`` ``[L, d_model]`` / ``[B, L, d_model]`` (float32, float16, or uint16 holding bfloat16).
        ``all_positions=False``: only the last position, ``[V]`` or ``[B, V]``. With ``state`` (``B`` rows) the
        call continues it and updates it; without, every row starts fresh. The GIL is released while it runs."""
        if (ids is None) == (embeddings is None):
            raise InvalidArgumentError("logits: give exactly one of ids or embeddings")
        if ids is not None:
            x, batched = _checks.token_ids(ids, "ids", self.vocab_size)
        else:
            x, batched = _checks.embeddings(embeddings, "embeddings", self.d_model)
        b, length = x.shape[0], x.shape[1]
        if state is None:
            native_state = self._native.new_state(b, "f32")
        else:
            self._check_state(state)
            if state.batch != b:
                raise InvalidArgumentError(f"state: holds {state.batch} sequences, expected {b} (the input's B)")
        if state is None:
            out = self._native.forward(native_state, x, bool(all_positions))
        else:
            with state._lock:
                out = self._native.forward(state._native, x, bool(all_positions))
                state._consumed(x[0].tolist() if ids is not None and b == 1 else None)
        v = out.shape[1]
        if all_positions:
            return out.reshape((b, length, v) if batched else (length, v))
        return out if batched else out.reshape(v)

    # ---- states ----------------------------------------------------------------------------------------------
    def new_state(self, batch=1, dtype="f32"):
        """A fresh (zero) state for ``batch`` sequences. ``dtype``: "f32", or "bf16" on the GPU."""
        batch = _checks.integer(batch, "batch", 1)
        return State(self._native.new_state(batch, str(dtype)), self)

    create_state = new_state

    def load_state(self, path):
        """A one-sequence state from a file written by ``State.save``; it must be this model's (same config and
        weights), else FileError. Its ``tokens`` are the tokens it stands for."""
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise MissingFileError(f"path: state file '{path}' does not exist")
        native, tokens = self._native.load_state(path)
        return State(native, self, tokens)

    def _check_state(self, state):
        if not isinstance(state, State):
            raise InvalidArgumentError(f"state: expected a mambacpp.State, found {type(state).__name__}")
        if state._model is not self:
            raise InvalidArgumentError("state: it belongs to another model (make it with this model's new_state)")

    # ---- layers ----------------------------------------------------------------------------------------------
    def block(self, layer):
        """Block ``layer`` as a layer of its own (``MambaBlock``)."""
        from ._block import MambaBlock
        return MambaBlock(self, layer)

    def mixer(self, layer, **kwargs):
        """Layer ``layer``'s mixer alone (``Mamba2Mixer`` or ``MambaMixer``: no block norm, no residual)."""
        from ._mixer import Mamba2Mixer, MambaMixer
        cls = Mamba2Mixer if self._config["arch"] == "mamba2" else MambaMixer
        return cls.from_model(self, layer, **kwargs)

    # ---- generation ------------------------------------------------------------------------------------------
    def generate(self, prompt, max_tokens=128, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05,
                 repeat_penalty=1.0, seed=None, stop=None, stream=False, **options):
        """Generates text after ``prompt`` (a str, or token ids). Sampling defaults follow llama.cpp;
        ``temperature=0`` is greedy, and gives what ``mambacpp generate --temp 0`` gives. ``stop``: a str or list
        of str that ends the text (not included). ``seed``: None draws one. Returns the text, or with
        ``stream=True`` an iterator of text pieces (whole UTF-8 characters) that concatenate to it.
        More keyword options as ``Engine.submit`` takes them (``repeat_last_n``, ``presence_penalty``,
        ``frequency_penalty``, ``stop_tokens``, ``ignore_eos``, ``grammar``, ``response_format``). Constrained
        output: ``response_format={"type": "json_object"}``, ``{"type": "json_schema", "json_schema": {"schema":
        {...}}}`` (OpenAI's shapes) or ``grammar="root ::= ..."`` (GBNF); the text then always parses and validates
        when it ends at the end-of-sequence token. Ctrl-C cancels the request cleanly.
        Each call starts from a fresh state (no prefix cache: use an ``Engine`` for that)."""
        engine = self._default_engine()
        request = dict(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                       repeat_penalty=repeat_penalty, seed=seed, stop=stop, **options)
        if stream:
            return engine.stream(prompt, **request)
        result = engine.run([prompt], **request)[0]
        if result.error:
            raise Error(result.error)
        return result.text

    # ---- chat ------------------------------------------------------------------------------------------------
    def apply_chat_template(self, messages, tools=None, add_generation_prompt=True, *, documents=None,
                            **template_kwargs):
        """The prompt text of a conversation, rendered with the model's own chat template (chat_template.jinja or
        tokenizer_config.json's chat_template; a GGUF's tokenizer.chat_template) as transformers'
        ``apply_chat_template(..., tokenize=False)`` renders it, and as ``mambacpp serve`` and ``generate --chat``
        do. ``messages``: a list of {"role", "content", ...} dicts, given to the template as they are; ``tools``,
        ``documents``: lists or None; ``template_kwargs``: more variables for the template (e.g.
        ``enable_thinking=False``). Raises Error when the model has no chat template, InvalidArgumentError when
        the template refuses the conversation (its raise_exception message) or it is not JSON data."""
        tmpl = self._load_chat_template()

        def as_json(value, what):
            try:
                return json.dumps(value, ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise InvalidArgumentError(f"{what}: expected JSON data (dicts, lists, str, numbers), {e}") from None

        if not isinstance(messages, (list, tuple)):
            raise InvalidArgumentError(f"messages: expected a list of dicts, found {type(messages).__name__}")
        return tmpl.render(as_json(list(messages), "messages"), as_json(tools, "tools"),
                           as_json(documents, "documents"), bool(add_generation_prompt),
                           as_json(template_kwargs, "template_kwargs"))

    def chat(self, messages, tools=None, add_generation_prompt=True, *, max_tokens=128, temperature=0.8, top_k=40,
             top_p=0.95, min_p=0.05, repeat_penalty=1.0, seed=None, stop=None, stream=False, documents=None,
             response_format=None, grammar=None, **template_kwargs):
        """The assistant's reply to a conversation: ``apply_chat_template`` (same arguments; the other keyword
        arguments are template variables), encoded without added special tokens (the template writes its own, as
        transformers encodes a rendered chat), then ``generate`` with these sampling options. Returns the text,
        or with ``stream=True`` an iterator of text pieces. The reply ends at the template's end of turn
        (``<|im_end|>``, ``<|eot_id|>``, ..., its eos_token), as ``mambacpp serve`` ends it, besides ``stop``.
        ``response_format`` / ``grammar``: constrained output, as ``generate`` takes them."""
        prompt = self.apply_chat_template(messages, tools, add_generation_prompt, documents=documents,
                                          **template_kwargs)
        stops = list(self._load_chat_template().stop_strings)
        if stop is not None:
            stops = ([stop] if isinstance(stop, str) else list(stop)) + stops
        if self.tokenizer is None:
            raise InvalidArgumentError("chat: the model has no tokenizer.json, so the rendered prompt cannot be "
                                       "encoded; use apply_chat_template and encode it yourself")
        ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        return self.generate(ids, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                             min_p=min_p, repeat_penalty=repeat_penalty, seed=seed, stop=stops or None, stream=stream,
                             response_format=response_format, grammar=grammar)

    def _load_chat_template(self):
        if self._chat_template is None:
            self._chat_template = _load_chat_template(self.path) or False
        if self._chat_template is False:
            raise Error(f"chat: the model '{self.path}' has no chat template (looked for chat_template.jinja and "
                        "tokenizer_config.json's chat_template, or a GGUF's tokenizer.chat_template)")
        return self._chat_template

    def _default_engine(self):
        with self._engine_lock:
            if self._engine is None:
                from ._engine import Engine
                self._engine = Engine(self, max_seqs=8, state_cache_mb=0)
            return self._engine
