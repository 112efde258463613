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


FAMILIES = sorted(p for p in (FIXTURES / "tokenizers").iterdir() if (p / "cases.json").exists()) \
    if (FIXTURES / "tokenizers").exists() else []


def test_tokenizer_families_exist():
    assert len(FAMILIES) >= 5, "expected the HF tokenizers fixtures under fixtures/tokenizers"


@pytest.mark.parametrize("family", FAMILIES, ids=[p.name for p in FAMILIES])
def test_other_tokenizer_families_match_hf(family):
    tok = mambacpp.Tokenizer(family / "tokenizer.json")
    cases = load_json(family / "cases.json")
    assert cases["encode"] and cases["decode"]
    for c in cases["encode"]:
        assert tok.encode(c["text"]) == c["ids"], c["text"]
        assert tok.encode(c["text"], add_special_tokens=True) == c["ids_special"], c["text"]
    for c in cases["decode"]:
        assert tok.decode(c["ids"]) == c["decoded"]
        assert tok.decode(c["ids"], skip_special=True) == c["decoded_skip_special"]
