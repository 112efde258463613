"""Model.apply_chat_template and Model.chat: the model's own template renders as transformers renders it
(fixtures/chat/rendered, the same cases tests/chat_fixtures_test.cpp checks in C++) and as `mambacpp generate
--chat` renders it (the CLI's prompt tokens); chat() equals `generate --chat` greedily; a model without a template
is a clear error."""

import json
import os

import pytest

import mambacpp
from conftest import DEFAULT_MODEL, FIXTURES, THREADS, load_json, run_cli

# Qwen3's template: thinking switches, tools and tool results, content parts; its fixture has one case of each.
TEMPLATE = "Qwen-Qwen3-0.6B"


def model_dir_with_template(tmp_path, name):
    """The shipped model's files beside a tokenizer_config.json carrying the fixture template `name`."""
    rendered = load_json(FIXTURES / "chat" / "rendered" / f"{name}.json")
    d = tmp_path / "model"
    d.mkdir()
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        os.symlink(DEFAULT_MODEL / f, d / f)
    source = (FIXTURES / "chat" / "templates" / f"{name}.jinja").read_text()
    config = {"chat_template": source, **rendered["special_tokens"]}
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d, rendered["cases"]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    d, cases = model_dir_with_template(tmp_path_factory.mktemp("chat"), TEMPLATE)
    return mambacpp.Model(d, device="cpu", threads=THREADS), cases


def render(model, case):
    return model.apply_chat_template(case["messages"], case["tools"], case["add_generation_prompt"],
                                     **case["chat_template_kwargs"])


RENDERED = sorted(p.stem for p in (FIXTURES / "chat" / "rendered").glob("*.json"))


@pytest.mark.parametrize("name", RENDERED)
def test_renders_as_transformers(name, tmp_path):
    d, cases = model_dir_with_template(tmp_path, name)
    model = mambacpp.Model(d, device="cpu", threads=THREADS)
    for case in cases:
        if "output" in case:
            assert render(model, case) == case["output"], case["name"]
        else:  # transformers raised: so does the template here, as bad input
            with pytest.raises(mambacpp.InvalidArgumentError):
                render(model, case)


def test_every_rendered_fixture_is_checked():
    assert len(RENDERED) >= 10 and TEMPLATE in RENDERED


def test_renders_as_the_cli(chat_model, tmp_path):
    model, cases = chat_model
    compared = 0
    for case in cases:
        if "output" not in case or any(not isinstance(m.get("content"), (str, type(None))) for m in case["messages"]):
            continue  # the CLI joins content parts first (as the server does): compared with transformers above
        body = {"messages": case["messages"], "add_generation_prompt": case["add_generation_prompt"],
                "chat_template_kwargs": case["chat_template_kwargs"]}
        if case["tools"] is not None:
            body["tools"] = case["tools"]
        path = tmp_path / f"{case['name']}.json"
        path.write_text(json.dumps(body))
        cli = json.loads(run_cli("generate", "--device", "cpu", "--json", "-m", model.path, "--chat",
                                 "--chat-file", path, "-n", "0"))
        ours = model.tokenizer.encode(render(model, case), add_special_tokens=False)
        assert ours == cli["prompt_tokens"], case["name"]
        compared += 1
    assert compared >= 8


def test_chat_equals_generate_chat(chat_model):
    model, _ = chat_model
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def parse_args("}]
    ref = json.loads(run_cli("generate", "--device", "cpu", "--json", "-m", model.path, "--chat", "--system",
                             messages[0]["content"], "-p", messages[1]["content"], "--temp", "0", "-n", "24"))
    text = model.chat(messages, max_tokens=24, temperature=0)
    assert text == ref["text"]
    assert "".join(model.chat(messages, max_tokens=24, temperature=0, stream=True)) == text


def test_template_kwargs_reach_the_template(chat_model):
    model, _ = chat_model
    messages = [{"role": "user", "content": "hi"}]
    thinking_off = model.apply_chat_template(messages, enable_thinking=False)
    assert thinking_off.endswith("<think>\n\n</think>\n\n")
    assert not model.apply_chat_template(messages).endswith("</think>\n\n")
    assert not model.apply_chat_template(messages, add_generation_prompt=False).endswith("assistant\n")


def test_a_model_without_a_template_is_an_error(model):
    with pytest.raises(mambacpp.Error, match="has no chat template"):
        model.apply_chat_template([{"role": "user", "content": "hi"}])
    with pytest.raises(mambacpp.Error, match="has no chat template"):
        model.chat([{"role": "user", "content": "hi"}])


def test_bad_conversations_are_invalid_arguments(chat_model, tmp_path):
    model, _ = chat_model
    with pytest.raises(mambacpp.InvalidArgumentError, match="messages"):
        model.apply_chat_template("hi")
    with pytest.raises(mambacpp.InvalidArgumentError, match="messages: expected JSON data"):
        model.apply_chat_template([{"role": "user", "content": object()}])
    # A template's raise_exception message reaches the caller; chat_template.jinja is found beside the model too.
    d = tmp_path / "raising"
    d.mkdir()
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        os.symlink(DEFAULT_MODEL / f, d / f)
    (d / "chat_template.jinja").write_text(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('the first turn must be the user') }}{% endif %}"
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    raising = mambacpp.Model(d, device="cpu", threads=THREADS)
    assert raising.apply_chat_template([{"role": "user", "content": "hi"}]) == "[user] hi\n"
    with pytest.raises(mambacpp.InvalidArgumentError, match="the first turn must be the user"):
        raising.apply_chat_template([{"role": "system", "content": "x"}])


def test_chat_stops_at_the_end_of_turn(tmp_path):
    """Model.chat ends the reply at the template's end of turn (here an eos_token the shipped model writes often),
    as the server and `generate --chat` do; the text before it is generate's text cut there."""
    d, _ = model_dir_with_template(tmp_path, TEMPLATE)
    config = json.loads((d / "tokenizer_config.json").read_text())
    config["eos_token"] = "e"  # a turn end the untrained model reaches within a few tokens
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    model = mambacpp.Model(d, device="cpu", threads=THREADS)
    messages = [{"role": "user", "content": "def parse_args("}]
    ids = model.tokenizer.encode(model.apply_chat_template(messages), add_special_tokens=False)
    cut = 0
    for seed in range(4):
        full = model.generate(ids, max_tokens=48, temperature=1.0, seed=seed)
        reply = model.chat(messages, max_tokens=48, temperature=1.0, seed=seed)
        assert "e" not in reply
        assert "<|im_end|>" not in reply
        if "e" in full:
            assert reply == full[:full.index("e")]
            cut += 1
        assert "".join(model.chat(messages, max_tokens=48, temperature=1.0, seed=seed, stream=True)) == reply
    assert cut >= 2


def test_chat_and_generate_follow_a_json_schema(chat_model):
    model, _ = chat_model
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
              "required": ["ok"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    for seed in range(5):
        text = model.generate("def f(", max_tokens=200, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=seed,
                              response_format=fmt)
        value = json.loads(text)
        assert isinstance(value["ok"], bool) and set(value) <= {"ok", "n"}
    reply = model.chat([{"role": "user", "content": "JSON?"}], max_tokens=200, temperature=1.0, seed=1,
                       response_format=fmt)
    assert isinstance(json.loads(reply)["ok"], bool)
    # Any object: strings are unbounded, so 16 tokens rarely finish one; every prefix still starts an object.
    assert model.generate("x", max_tokens=16, temperature=1.0, seed=2,
                          response_format={"type": "json_object"}).startswith("{")
    assert model.generate("x", max_tokens=8, temperature=0, grammar='root ::= "yes" | "no"') in ("yes", "no")
    with pytest.raises(mambacpp.InvalidArgumentError, match="the keyword 'pattern'"):
        model.generate("x", response_format={"type": "json_schema", "json_schema": {"schema": {"pattern": "a"}}})
    with pytest.raises(mambacpp.InvalidArgumentError, match="grammar line 1, column 10"):
        model.generate("x", grammar="root ::= [a")
