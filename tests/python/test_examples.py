"""The examples in examples/python run, and what they show holds."""

import importlib.util

from conftest import ROOT


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / "python" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chat_keeps_its_state_between_turns(model, capsys):
    results = list(load("chat").chat(["def add(a, b):", "def sub(a, b):"], model=model, max_tokens=24))
    assert len(results) == 2
    # Turn 2's prompt is turn 1's prompt and reply plus new text: all but the new text comes from the cache.
    assert results[1].cached_prompt_tokens >= results[0].prompt_tokens + len(results[0].tokens) - 1
    printed = capsys.readouterr().out
    assert results[0].text in printed and results[1].text in printed


def test_block_layer_example():
    assert load("block_layer").main() < 1e-5
