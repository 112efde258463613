"""Engine: the serving engine (continuous batching over one model, exact state prefix cache) from Python."""

import collections
import os
import threading

from . import _checks
from ._errors import Error, InvalidArgumentError
import json

from ._mambacpp import _Engine, _SamplingParams, _engine_defaults, _json_object_grammar, _json_schema_to_grammar


class Engine:
    """Continuous batching over one ``Model``: ``submit`` requests (from any thread), and ``step`` (one thread at a
    time; the GIL is released while it runs) feeds one token to every decoding request plus the next prompt chunks.
    Each request gets the tokens it would get alone. The prefix cache (``state_cache_mb``; 0: off) keeps exact
    states of earlier requests, so a prompt that continues one (a chat turn) prefills only its new tokens."""

    def __init__(self, model, *, max_seqs=None, max_queue=None, batch_tokens=None, max_prompt=None,
                 max_new_tokens=None, state_cache_mb=None, state_checkpoint_interval=None, state_dtype=None,
                 device_sampling=None, draft_model=None, state_cache_dir=None, state_cache_disk_mb=None,
                 draft_mtp=False):
        """Options left at None take the C++ defaults (mambacpp/engine.h: EngineOptions): max_seqs 32 requests at
        once, max_queue 1024 waiting, batch_tokens per step (0: the model's batch_tokens), max_prompt 65536,
        state_cache_mb 1024 (0: no prefix cache), state_checkpoint_interval (prompt positions whose state is
        cached), state_dtype "f32", device_sampling True. ``draft_model``: a smaller ``Model`` of the same
        vocabulary that drafts tokens for requests submitted with ``draft_model=True`` (speculative decoding).
        ``draft_mtp=True``: load the model's own multi-token-prediction block (Nemotron-H checkpoints with
        num_nextn_predict_layers) for requests submitted with ``draft_mtp=True``; a model without one is refused.
        ``state_cache_dir``: a directory that keeps the prefix cache's states on disk too (docs/server.md), so that
        another Engine or process with the same directory prefills only what they do not cover; it needs
        state_cache_mb > 0. ``state_cache_disk_mb``: its budget (None: 4096, as ``mambacpp serve``)."""
        from ._model import Model
        if not isinstance(model, Model):
            raise InvalidArgumentError(f"model: expected a mambacpp.Model, found {type(model).__name__}")
        if draft_model is not None and not isinstance(draft_model, Model):
            raise InvalidArgumentError(
                f"draft_model: expected a mambacpp.Model or None, found {type(draft_model).__name__}")
        self.draft_model = draft_model
        self.model = model
        o = _engine_defaults()
        given = dict(max_seqs=max_seqs, max_queue=max_queue, batch_tokens=batch_tokens, max_prompt=max_prompt,
                     max_new_tokens=max_new_tokens, state_cache_mb=state_cache_mb,
                     state_checkpoint_interval=state_checkpoint_interval, state_dtype=state_dtype,
                     device_sampling=device_sampling)
        o.update({k: v for k, v in given.items() if v is not None})
        low = {"max_seqs": 1, "max_prompt": 1}
        for k in ("max_seqs", "max_queue", "batch_tokens", "max_prompt", "max_new_tokens", "state_cache_mb",
                  "state_checkpoint_interval"):
            o[k] = _checks.integer(o[k], k, low.get(k, 0))
        if state_cache_dir is None:
            if state_cache_disk_mb is not None:
                raise InvalidArgumentError("state_cache_disk_mb: needs state_cache_dir")
            cache_dir, disk_mb = "", 0
        else:
            cache_dir = os.fspath(state_cache_dir)
            if not cache_dir:
                raise InvalidArgumentError("state_cache_dir: expected a directory path, found ''")
            if o["state_cache_mb"] == 0:
                raise InvalidArgumentError("state_cache_dir: needs the in-memory prefix cache (state_cache_mb > 0): "
                                           "a state goes to disk as it enters memory")
            disk_mb = _checks.integer(4096 if state_cache_disk_mb is None else state_cache_disk_mb,
                                      "state_cache_disk_mb", 1, 2**32)
        o["state_cache_dir"], o["state_cache_disk_mb"] = cache_dir or None, disk_mb
        tok = model.tokenizer._native if model.tokenizer is not None else None
        self._native = _Engine(model._native, tok, o["max_seqs"], o["max_queue"], o["batch_tokens"], o["max_prompt"],
                               o["max_new_tokens"], o["state_cache_mb"], o["state_checkpoint_interval"],
                               str(o["state_dtype"]), bool(o["device_sampling"]),
                               None if draft_model is None else draft_model._native, cache_dir, disk_mb,
                               bool(draft_mtp))
        self.options = o
        self._step_lock = threading.Lock()
        self._handlers_lock = threading.Lock()
        self._handlers = {}  # id -> on_event
        self._results = {}   # id -> GenerateResult, until pop_result

    # ---- requests --------------------------------------------------------------------------------------------
    def submit(self, prompt, max_tokens=128, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0,
               seed=None, stop=None, *, repeat_last_n=64, presence_penalty=0.0, frequency_penalty=0.0,
               stop_tokens=None, ignore_eos=False, logprobs=None, save_state=None, on_event=None, draft_ngram=0,
               draft_model=False, draft_max=0, draft_adaptive=True, grammar=None, response_format=None,
               draft_mtp=False):
        """Queues a request and returns its id. ``prompt``: a str (needs the model's tokenizer) or token ids.
        ``on_event(event)`` (optional) is called after the step that produced each ``RequestEvent`` (new text, a
        token, and a last one with ``finished`` and ``result``); without it only the result is kept, for
        ``pop_result``. ``logprobs``: None, or 0..20 alternatives per token. ``save_state``: a path the state at the
        request's end is written to. Speculative decoding: ``draft_ngram`` N > 0 drafts by prompt lookup (the
        continuation of the last N tokens' earlier occurrence), ``draft_model=True`` with the engine's draft model,
        ``draft_mtp=True`` with the model's own MTP block (an Engine made with ``draft_mtp=True``);
        ``draft_max`` tokens per step at most (0: the default), ``draft_adaptive`` shortens drafts while they are
        rejected. Greedy output is unchanged by it; sampling keeps the model's distribution. Constrained output
        (never drafts): ``grammar`` a GBNF text, or ``response_format`` {"type": "json_object"} / {"type":
        "json_schema", "json_schema": {"schema": {...}}} (a schema feature not supported is an
        InvalidArgumentError naming it). Raises InvalidArgumentError (and queues nothing) on a bad request."""
        ids = self._prompt_ids(prompt)
        sampling = _SamplingParams()
        sampling.temperature = _checks.number(temperature, "temperature")
        sampling.top_k = _checks.integer(top_k, "top_k", -2**31, 2**31 - 1)
        sampling.top_p = _checks.number(top_p, "top_p")
        sampling.min_p = _checks.number(min_p, "min_p")
        sampling.repeat_penalty = _checks.number(repeat_penalty, "repeat_penalty")
        sampling.repeat_last_n = _checks.integer(repeat_last_n, "repeat_last_n", 0, 2**31 - 1)
        sampling.presence_penalty = _checks.number(presence_penalty, "presence_penalty")
        sampling.frequency_penalty = _checks.number(frequency_penalty, "frequency_penalty")
        if seed is not None:
            sampling.seed = _checks.integer(seed, "seed", 0, 2**64 - 1)
            sampling.seed_given = True
        sampling.validate()
        stops = _checks.strings(stop, "stop")
        stop_ids = [] if not stop_tokens else _checks.token_ids(stop_tokens, "stop_tokens", self.model.vocab_size,
                                                                  allow_batch=False)[0][0].tolist()
        logprobs = -1 if logprobs is None else _checks.integer(logprobs, "logprobs", 0, 20)
        max_tokens = _checks.integer(max_tokens, "max_tokens", 0, 2**31 - 1)
        draft_ngram = _checks.integer(draft_ngram, "draft_ngram", 0, 16)
        draft_max = _checks.integer(draft_max, "draft_max", 0, 32)
        grammar_text = _grammar_of(grammar, response_format)
        if on_event is not None and not callable(on_event):
            raise InvalidArgumentError(f"on_event: expected a callable, found {type(on_event).__name__}")
        # Nobody else holds the id until submit returns, so an exception after the engine took the request (Ctrl-C
        # is raised as soon as a C call returns) cancels it here: the native submit puts the id in `submitted`
        # before it returns, so that even one raised at its return finds it.
        submitted, registered = [], False
        try:
            with self._handlers_lock:  # held across submit: the request's first event finds its handler
                self._native.submit(ids, max_tokens, sampling, stop_ids, stops, bool(ignore_eos), logprobs,
                                    "" if save_state is None else os.fspath(save_state), draft_ngram,
                                    bool(draft_model), draft_max, bool(draft_adaptive), grammar_text,
                                    on_event is not None, submitted, bool(draft_mtp))
                if on_event is not None:
                    self._handlers[submitted[0]] = on_event
                    registered = True  # no signal is handled between these two lines
            return submitted[0]
        except BaseException:
            self._forget(submitted, registered)
            raise

    def cancel(self, request_id):
        """Cancels a queued or running request: its last event (reason "cancelled") comes at the next step.
        False when it has already finished."""
        return self._native.cancel(_checks.integer(request_id, "request_id", 0))

    def step(self):
        """One forward over every active row, then the events it produced go to their requests' ``on_event``.
        False when there was nothing to do."""
        with self._step_lock:
            worked = self._native.step()
            events = self._native.take_events()
        self._dispatch(events)
        return worked

    def pop_result(self, request_id):
        """The finished request's GenerateResult (once), or None while it runs."""
        with self._handlers_lock:
            return self._results.pop(request_id, None)

    def run(self, prompts, **request):
        """Submits every prompt with the same options, steps until all have finished and returns their results in
        order. A ``seed`` gives request i the seed ``seed + i`` (as ``mambacpp generate`` does), so request i reruns
        alone with ``seed + i``. Ctrl-C cancels them and re-raises."""
        if isinstance(prompts, str) or not hasattr(prompts, "__len__"):
            raise InvalidArgumentError("prompts: expected a list of prompts (str or token ids)")
        seed = request.pop("seed", None)
        ids = []
        try:
            for i, p in enumerate(prompts):
                ids.append(self.submit(p, seed=None if seed is None else _checks.integer(seed, "seed", 0) + i,
                                       **request))
            results = {}
            while len(results) < len(ids):
                if not self.step() and len(results) < len(ids):
                    self._collect(ids, results)
                    if len(results) < len(ids):
                        raise Error("engine: no work left but requests have not finished")
                self._collect(ids, results)
            return [results[i] for i in ids]
        except BaseException:
            self._abandon(ids)
            raise

    def stream(self, prompt, **request):
        """Submits one request and returns a ``TextStream``: iterating it steps the engine and yields the text as it
        comes (whole UTF-8 characters; the pieces concatenate to the result's text); ``.result`` is the
        GenerateResult once it has finished. Closing it early (or Ctrl-C) cancels the request."""
        return TextStream(self, prompt, request)

    # ---- the prefix cache ------------------------------------------------------------------------------------
    def load_state(self, path):
        """Reads a state file into the prefix cache; returns the tokens it stands for (a prompt that continues
        them prefills only the rest)."""
        with self._step_lock:
            return self._native.load_state(os.fspath(path))

    def clear_cache(self):
        with self._step_lock:
            self._native.clear_cache()

    @property
    def stats(self):
        """Running (now and at the peak) and queued requests, cache entries/bytes/hits/misses, steps (as of the last
        step)."""
        return self._native.stats()

    # ---- internals -------------------------------------------------------------------------------------------
    def _prompt_ids(self, prompt):
        if isinstance(prompt, str):
            if self.model.tokenizer is None:
                raise InvalidArgumentError("prompt: the model has no tokenizer.json, so text cannot be encoded; "
                                           "give token ids")
            ids = self.model.tokenizer.encode(prompt)
            if not ids:
                raise InvalidArgumentError("prompt: expected at least one token, found an empty text")
            return ids
        return _checks.token_ids(prompt, "prompt", self.model.vocab_size, allow_batch=False)[0][0].tolist()

    def _dispatch(self, events):
        # Every event is delivered even when a handler raises (the first exception is re-raised afterwards):
        # otherwise the other requests' events of this step, their last ones included, would be lost.
        error = None
        for ev in events:
            with self._handlers_lock:
                handler = self._handlers.get(ev.id)
                if ev.finished:
                    self._handlers.pop(ev.id, None)
                    if handler is None:
                        self._results[ev.id] = ev.result
            if handler is not None:
                try:
                    handler(ev)
                except BaseException as e:  # noqa: B036 - re-raised below, after the other events
                    error = error or e
        if error is not None:
            raise error

    def _collect(self, ids, results):
        for i in ids:
            if i not in results:
                r = self.pop_result(i)
                if r is not None:
                    results[i] = r

    def _forget(self, ids, registered):
        """Cancels `ids` without stepping (submit runs on any thread) and drops their last events, at a later step.
        `registered`: they had handlers, so a missing one has had its last event already."""
        for i in ids:  # first: should a second Ctrl-C cut this short, the request has stopped
            self._native.cancel(i)
        with self._handlers_lock:
            for i in ids:
                if self._results.pop(i, None) is None and (i in self._handlers or not registered):
                    self._handlers[i] = _ignore

    def _abandon(self, ids):
        """Cancels `ids` and steps until each has sent its last event, so that their slots are free again."""
        with self._handlers_lock:
            for i in ids:
                self._handlers.pop(i, None)
        pending = set()
        for i in ids:
            if self._native.cancel(i):
                pending.add(i)
        for _ in range(1000):
            pending = {i for i in pending if self.pop_result(i) is None}
            if not pending or not self.step():
                break
        for i in ids:
            self.pop_result(i)


def _grammar_of(grammar, response_format):
    """The GBNF text of a request's ``grammar`` or ``response_format`` ("" for none)."""
    if grammar is not None and response_format is not None:
        raise InvalidArgumentError("grammar and response_format: give one of them, not both")
    if grammar is not None:
        if not isinstance(grammar, str):
            raise InvalidArgumentError(f"grammar: expected a GBNF str, found {type(grammar).__name__}")
        return grammar
    if response_format is None:
        return ""
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return ""
    if kind == "json_object" and "schema" not in response_format:
        return _json_object_grammar()
    if kind in ("json_object", "json_schema"):
        schema = response_format.get("schema")
        if schema is None and isinstance(response_format.get("json_schema"), dict):
            schema = response_format["json_schema"].get("schema")
        if schema is None:
            raise InvalidArgumentError('response_format: {"type": "json_schema"} needs "json_schema": {"schema": {...}}')
        try:
            text = json.dumps(schema, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"response_format: the schema is not JSON data, {e}") from None
        return _json_schema_to_grammar(text)
    raise InvalidArgumentError('response_format: expected {"type": "text" | "json_object" | "json_schema", ...}, '
                               f"found {response_format!r}")


def _ignore(event):
    pass


class TextStream:
    """The text of one request as it is generated (``Engine.stream``, ``Model.generate(stream=True)``)."""

    def __init__(self, engine, prompt, request):
        self._engine = engine
        self._events = collections.deque()
        self.result = None  # the GenerateResult, once finished
        self._done = True   # until submit has returned: if it raises, it has cancelled the request itself
        self.id = engine.submit(prompt, on_event=self._events.append, **request)
        self._done = False

    def __iter__(self):
        return self

    def __next__(self):
        try:
            while True:
                while self._events:
                    ev = self._events.popleft()
                    if ev.finished:
                        self._done, self.result = True, ev.result
                        if ev.result is not None and ev.result.error:
                            raise Error(ev.result.error)
                    if ev.text:
                        return ev.text
                if self._done:
                    raise StopIteration
                if not self._engine.step() and not self._events:
                    self._done = True
                    raise Error("engine: no work left but the request has not finished")
        except (StopIteration, Error):
            raise
        except BaseException:  # Ctrl-C, or an error in another request's handler: free the slot, then re-raise
            self.close()
            raise

    def close(self):
        """Cancels the request if it is still running (and waits for its slot to be free)."""
        if not self._done:
            self._done = True
            self._engine._abandon([self.id])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # Only cancel: a finalizer may run inside step() on this thread, where stepping again would deadlock. The
        # request sends its last event at the next step, whoever runs it.
        if not self._done:
            try:
                self._engine._native.cancel(self.id)
            except Exception:
                pass
