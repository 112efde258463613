"""Tokenizer against HF tokenizers' own output (fixtures/tokenizer/cases.json, made by scripts/make_fixtures.py)."""

import pytest

import mambacpp
from conftest import FIXTURES, load_json

CASES = load_json(FIXTURES / "tokenizer" / "cases.json")


def test_cases_exist():
    assert len(CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
def test_encode_decode_match_hf(model, case):
    tok = model.tokenizer
    assert tok.encode(case["text"]) == case["ids"]
    assert tok.decode(case["ids"]) == case["decoded"]
    assert tok.decode(case["ids"], skip_special=True) == case["decoded_skip_special"]


def test_token_bytes_concatenate_to_the_text(model):
    tok = model.tokenizer
    text = "naïve café — ünïcödé"
    ids = tok.encode(text)
    assert b"".join(tok.token_bytes(i) for i in ids) == tok.decode_bytes(ids) == text.encode()


def test_standalone_tokenizer_file(model):
    tok = mambacpp.Tokenizer(FIXTURES / "tokenizer" / "tokenizer.json")
    assert tok.vocab_size >= 4096 and tok.encode("def") == model.tokenizer.encode("def")
