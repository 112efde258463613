"""Speculative decoding from Python: greedy output with prompt lookup or a draft model is the plain output, a model
drafting for itself has every draft accepted, and the results and stats count the drafts."""

import pytest

import mambacpp

# A prompt that repeats itself, so that prompt lookup finds continuations.
PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add("


def test_prompt_lookup_keeps_the_greedy_tokens(model):
    engine = mambacpp.Engine(model, state_cache_mb=0)
    plain = engine.run([PROMPT], max_tokens=40, temperature=0)[0]
    spec = engine.run([PROMPT], max_tokens=40, temperature=0, draft_ngram=3, draft_max=4)[0]
    assert spec.tokens == plain.tokens and spec.text == plain.text
    assert spec.draft_tokens > 0 and 0 <= spec.accepted_draft_tokens <= spec.draft_tokens
    assert plain.draft_tokens == 0
    stats = engine.stats
    assert stats["draft_tokens"] == spec.draft_tokens
    assert stats["accepted_draft_tokens"] == spec.accepted_draft_tokens


def test_model_drafting_for_itself_accepts_every_draft(model):
    engine = mambacpp.Engine(model, state_cache_mb=0, draft_model=model)
    plain = engine.run([PROMPT], max_tokens=30, temperature=0)[0]
    spec = engine.run([PROMPT], max_tokens=30, temperature=0, draft_model=True, draft_max=5)[0]
    assert spec.tokens == plain.tokens
    assert spec.draft_tokens > 0 and spec.accepted_draft_tokens == spec.draft_tokens


def test_bad_speculative_arguments(model):
    engine = mambacpp.Engine(model)
    with pytest.raises(mambacpp.InvalidArgumentError, match="--draft-model"):
        engine.submit(PROMPT, draft_model=True)
    with pytest.raises(mambacpp.InvalidArgumentError, match="draft_ngram"):
        engine.submit(PROMPT, draft_ngram=17)
    with pytest.raises(mambacpp.InvalidArgumentError, match="draft_model"):
        mambacpp.Engine(model, draft_model="models/default")
