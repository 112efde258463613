"""The MTP draft source from Python (draft_mtp): the keyword reaches the engine, and a model without
multi-token-prediction layers (the shipped pure Mamba model) is refused with the reason. Exactness on a checkpoint
with an MTP block: tests/mtp_test.cpp."""

import pytest

import mambacpp


def test_draft_mtp_needs_a_model_with_mtp_layers(model):
    with pytest.raises(mambacpp.InvalidArgumentError, match="no multi-token-prediction layers"):
        mambacpp.Engine(model, draft_mtp=True)
    engine = mambacpp.Engine(model)
    with pytest.raises(mambacpp.InvalidArgumentError, match="--draft-mtp"):
        engine.submit("def add(", draft_mtp=True)
    with pytest.raises(mambacpp.InvalidArgumentError, match="one source"):
        engine.submit("def add(", draft_mtp=True, draft_ngram=2)
