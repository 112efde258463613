"""Generation: greedy equals the CLI (`mambacpp generate --temp 0 --json`) and transformers' greedy tokens, seeded
sampling is reproducible, streaming pieces concatenate to the text, stop strings cut, the engine batches requests
without changing them, and cancelling or interrupting leaves the engine usable."""

import json
import signal
import threading
import _thread
import time

import numpy as np
import pytest

import mambacpp
from conftest import FIXTURES, load_json, run_cli

PROMPT = "def parse_args("


def cli_generate(*args):
    return json.loads(run_cli("generate", "--device", "cpu", "--json", *args))


def test_greedy_equals_cli(model):
    ref = cli_generate("-p", PROMPT, "--temp", "0", "-n", "40")
    engine = mambacpp.Engine(model, state_cache_mb=0)
    r = engine.run([PROMPT], max_tokens=40, temperature=0)[0]
    assert r.tokens == ref["tokens"] and r.text == ref["text"]
    assert r.finish_reason == ref["stop_reason"]
    assert model.generate(PROMPT, max_tokens=40, temperature=0) == ref["text"]


def test_greedy_equals_transformers(model):
    # The reference ran with eos_token_id=None (hence ignore_eos); its smallest top-2 margin (~5e-3) is far above
    # our logit error (~1e-5), so every token must agree (tests/reference_generation_test.cpp allows a divergence
    # only after a near-tie below 1e-3, and there is none in this fixture).
    ref = load_json(FIXTURES / "default_model" / "greedy.json")
    assert min(ref["generate_margins"]) > 1e-3
    assert model.tokenizer.encode(ref["prompt_text"]) == ref["prompt_ids"]
    engine = mambacpp.Engine(model, state_cache_mb=0)
    r = engine.run([ref["prompt_ids"]], max_tokens=ref["max_new_tokens"], temperature=0, ignore_eos=True)[0]
    assert r.tokens == ref["generate_ids"]


def test_seeded_sampling_is_reproducible_and_matches_cli(model):
    ref = cli_generate("-p", PROMPT, "-n", "30", "--seed", "1234")
    a = model.generate(PROMPT, max_tokens=30, seed=1234)
    b = model.generate(PROMPT, max_tokens=30, seed=1234)
    assert a == b == ref["text"]
    others = {model.generate(PROMPT, max_tokens=30, seed=s) for s in range(1, 6)}
    assert len(others) > 1, "different seeds should not all give the same text"


def test_stream_pieces_concatenate_to_the_text(model):
    text = model.generate(PROMPT, max_tokens=48, temperature=0)
    pieces = list(model.generate(PROMPT, max_tokens=48, temperature=0, stream=True))
    assert len(pieces) > 5 and all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == text


def test_stop_string_cuts_the_text(model):
    full = model.generate(PROMPT, max_tokens=40, temperature=0)
    stop = full[10:14]
    assert stop and full.find(stop) >= 0
    cut = model.generate(PROMPT, max_tokens=40, temperature=0, stop=stop)
    assert cut == full[:full.find(stop)]
    streamed = "".join(model.generate(PROMPT, max_tokens=40, temperature=0, stop=[stop], stream=True))
    assert streamed == cut


def test_engine_batch_equals_requests_alone(model):
    prompts = ["import os\n", "class A:\n", "def main():\n    x = ", "for i in range("]
    engine = mambacpp.Engine(model, max_seqs=4, state_cache_mb=0)
    together = engine.run(prompts, max_tokens=20, seed=99)
    for i, p in enumerate(prompts):
        alone = engine.run([p], max_tokens=20, seed=99 + i)[0]
        assert alone.tokens == together[i].tokens
    assert [r.seed for r in together] == [99, 100, 101, 102]


def test_engine_events_and_results(model):
    engine = mambacpp.Engine(model)
    events = []
    rid = engine.submit(PROMPT, max_tokens=12, temperature=0, logprobs=2, on_event=events.append)
    other = engine.submit([1, 2, 3], max_tokens=5, temperature=0)
    while engine.step():
        pass
    assert events[-1].finished and events[-1].id == rid
    result = events[-1].result
    tokens = [e.token.id for e in events if e.token is not None]
    assert tokens == result.tokens and len(tokens) == 12
    assert "".join(e.text for e in events) == result.text
    assert all(len(t.top) == 2 and t.logprob <= 0 for t in result.token_info)
    assert result.token_info[0].top[0].id == result.tokens[0]  # greedy: the best alternative is the token
    r2 = engine.pop_result(other)
    assert r2 is not None and len(r2.tokens) <= 5 and engine.pop_result(other) is None
    assert engine.stats["running"] == 0


def test_prefix_cache_serves_a_continued_prompt(model):
    engine = mambacpp.Engine(model, state_cache_mb=64)
    first = engine.run([PROMPT], max_tokens=16, temperature=0)[0]
    turn2 = model.tokenizer.encode(PROMPT) + first.tokens + model.tokenizer.encode("\n")
    r = engine.run([turn2], max_tokens=8, temperature=0)[0]
    assert r.cached_prompt_tokens >= len(turn2) - 2
    fresh = mambacpp.Engine(model, state_cache_mb=0).run([turn2], max_tokens=8, temperature=0)[0]
    assert r.tokens == fresh.tokens


def test_cancel(model):
    engine = mambacpp.Engine(model)
    rid = engine.submit(PROMPT, max_tokens=1000, ignore_eos=True)
    for _ in range(5):
        engine.step()
    assert engine.cancel(rid)
    while engine.step():
        pass
    r = engine.pop_result(rid)
    assert r.finish_reason == "cancelled" and 0 < len(r.tokens) < 1000
    assert not engine.cancel(rid)
    with pytest.raises(mambacpp.InvalidArgumentError):
        engine.cancel(rid + 100)


def test_closing_a_stream_cancels_it(model):
    engine = model._default_engine()
    stream = model.generate(PROMPT, max_tokens=500, ignore_eos=True, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    assert engine.stats["running"] == 0 and engine.stats["queued"] == 0


def test_ctrl_c_interrupts_generate_cleanly(model):
    # KeyboardInterrupt (as Ctrl-C raises it) arrives in the main thread during a long generate: it propagates,
    # the request is cancelled, and the next generate works. Python drops a KeyboardInterrupt whose handler runs
    # inside a finalizer ("Exception ignored in ..."; the garbage collector runs them at any allocation), so one
    # interrupt can be lost: while generate has not returned, another follows every 5 s, as a user presses Ctrl-C
    # again. interrupt_main() does nothing while SIGINT is ignored, as it is in a process that a non-interactive
    # shell started in the background (`.ci/run &`): such a run saw generate go through all 2^20 tokens (~9 min)
    # and return. So the test installs Python's handler, as an interactive run has it.
    previous_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    returned = threading.Event()

    def interrupt():
        delay = 0.3
        while not returned.wait(delay):
            _thread.interrupt_main()
            delay = 5.0

    interrupter = threading.Thread(target=interrupt)
    interrupter.start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            model.generate(PROMPT, max_tokens=1 << 20, ignore_eos=True)
    finally:
        returned.set()
        interrupter.join()
        signal.signal(signal.SIGINT, previous_handler)
    assert time.monotonic() - start < 30
    engine = model._default_engine()
    assert engine.stats["running"] == 0 and engine.stats["queued"] == 0
    assert model.generate(PROMPT, max_tokens=8, temperature=0) == model.generate(PROMPT, max_tokens=8, temperature=0)


def test_generate_from_ids(model):
    ids = model.tokenizer.encode(PROMPT)
    assert model.generate(ids, max_tokens=10, temperature=0) == \
        model.generate(np.array(ids), max_tokens=10, temperature=0) == \
        model.generate(PROMPT, max_tokens=10, temperature=0)


def test_save_state_at_the_end(model, tmp_path):
    path = tmp_path / "end.state"
    engine = mambacpp.Engine(model, state_cache_mb=0)
    r = engine.run([PROMPT], max_tokens=6, temperature=0, save_state=path)[0]
    loaded = model.load_state(path)
    # The state of every token fed: the prompt and each generated token but the last (which was never fed).
    assert r.finish_reason == "length"
    assert loaded.tokens == model.tokenizer.encode(PROMPT) + r.tokens[:-1]
    # Feeding the last token to it gives the logits a full pass gives at that position.
    full = model.logits(loaded.tokens + r.tokens[-1:])[-1]
    np.testing.assert_allclose(model.logits(r.tokens[-1:], state=loaded)[0], full, rtol=0, atol=1e-5 * np.abs(full).max())


@pytest.mark.gpu
def test_gpu_greedy_equals_cpu():
    cpu = mambacpp.Model(device="cpu")
    gpu = mambacpp.Model(device="cuda", dtype="fp32")
    assert gpu.device == "cuda"
    ref = load_json(FIXTURES / "default_model" / "greedy.json")
    a = mambacpp.Engine(cpu, state_cache_mb=0).run([ref["prompt_ids"]], max_tokens=50, temperature=0, ignore_eos=True)
    b = mambacpp.Engine(gpu, state_cache_mb=0).run([ref["prompt_ids"]], max_tokens=50, temperature=0, ignore_eos=True)
    assert a[0].tokens == b[0].tokens


def test_text_stream_result(model):
    engine = mambacpp.Engine(model, state_cache_mb=0)
    with engine.stream(PROMPT, max_tokens=20, temperature=0) as s:
        text = "".join(s)
    assert s.result is not None and s.result.text == text and len(s.result.tokens) == 20
    assert s.result.tokens == engine.run([PROMPT], max_tokens=20, temperature=0)[0].tokens


def test_a_raising_handler_loses_no_other_event(model):
    engine = mambacpp.Engine(model, state_cache_mb=0)

    calls = []

    def bad(event):  # fails on its request's last event, the step where the other request finishes too
        calls.append(event)
        if event.finished:
            raise RuntimeError("handler failed")

    engine.submit(PROMPT, max_tokens=3, temperature=0, on_event=bad)
    other = engine.submit(PROMPT, max_tokens=3, temperature=0)
    with pytest.raises(RuntimeError, match="handler failed"):
        while engine.step():
            pass
    assert calls[-1].finished
    r = engine.pop_result(other)  # finished in the same step, after the failing handler ran
    assert r is not None and len(r.tokens) == 3
    assert not engine.step()


class InterruptedSubmit:
    """An engine's native half whose submit raises KeyboardInterrupt as it returns, after the engine took the
    request: Ctrl-C can land there (CPython checks for signals after a C call), before Python holds the id."""

    def __init__(self, native):
        self.native = native

    def __getattr__(self, name):
        return getattr(self.native, name)

    def submit(self, *args, **kwargs):
        self.native.submit(*args, **kwargs)
        raise KeyboardInterrupt


class InterruptedRelease:
    """A lock whose next release is followed by KeyboardInterrupt (the end of submit's `with`)."""

    def __init__(self, lock):
        self.lock, self.armed = lock, True

    def __enter__(self):
        return self.lock.__enter__()

    def __exit__(self, *exc):
        self.lock.__exit__(*exc)
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")  # e.g. from TextStream.__del__
def test_ctrl_c_inside_submit_cancels_the_request(model):
    # Nobody else holds the id of a request whose submit raised: submit must cancel it, or it runs on (up to
    # max_tokens) in the engine, and in the model's default engine under every later generate.
    engine = mambacpp.Engine(model, state_cache_mb=0)
    default = model._default_engine()
    events = []
    request = dict(max_tokens=500, ignore_eos=True)
    cases = [
        (engine, "_native", lambda: engine.submit(PROMPT, **request)),
        (engine, "_native", lambda: engine.submit(PROMPT, on_event=events.append, **request)),
        (engine, "_native", lambda: engine.run([PROMPT, PROMPT], **request)),
        (default, "_native", lambda: model.generate(PROMPT, stream=True, **request)),
        (default, "_native", lambda: model.generate(PROMPT, **request)),
        (engine, "_handlers_lock", lambda: engine.submit(PROMPT, **request)),
        (engine, "_handlers_lock", lambda: engine.submit(PROMPT, on_event=events.append, **request)),
    ]
    for e, name, call in cases:
        real = getattr(e, name)
        setattr(e, name, (InterruptedSubmit if name == "_native" else InterruptedRelease)(real))
        try:
            with pytest.raises(KeyboardInterrupt):
                call()
        finally:
            setattr(e, name, real)
        for _ in range(3):
            e.step()
        assert e.stats["running"] == 0 and e.stats["queued"] == 0
        assert not e._handlers and not e._results
    assert not events  # a request whose submit raised calls no handler
    assert engine.run([PROMPT], max_tokens=8, temperature=0)[0].text == \
        model.generate(PROMPT, max_tokens=8, temperature=0) == model.generate(PROMPT, max_tokens=8, temperature=0)
