#!/usr/bin/env python3
"""Renders every chat template under fixtures/chat/templates/ with transformers' own renderer over a fixed set of
conversations, and writes what it produced (or the error it raised) as JSON: the references that
tests/chat_fixtures_test.cpp compares mambacpp's interpreter (src/chat) against.

    python3 scripts/make_chat_fixtures.py OUTDIR        # then copy OUTDIR/*.json to fixtures/chat/rendered/

Needs transformers (and its jinja2); no tokenizer, model or network: the templates are rendered the way
apply_chat_template renders them (transformers.utils.chat_template_utils: render_jinja_template when present, else
_compile_jinja_template + render with the same keyword arguments), with the special tokens listed below standing in
for the model's tokenizer_config.json.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "..", "fixtures", "chat", "templates")

# bos/eos of each family, as their tokenizer_config.json files give them (transformers passes every special token
# to the template; these are the two templates read).
SPECIAL_TOKENS = {
    "CohereForAI": {"bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>"},
    "Mistral": {"bos_token": "<s>", "eos_token": "</s>"},
    "mistralai": {"bos_token": "<s>", "eos_token": "</s>"},
    "NVIDIA": {"bos_token": "<s>", "eos_token": "<|im_end|>"},
    "NousResearch": {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"},
    "Qwen": {"bos_token": None, "eos_token": "<|im_end|>"},
    "ibm": {"bos_token": "<|end_of_text|>", "eos_token": "<|end_of_text|>"},
    "meta": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    # Falcon-H1: the special tokens of a tokenizer_config.json carrying Falcon-H1's chat template (that of
    # onnx-internal-testing/tiny-random-FalconH1ForCausalLM; the template reads bos_token only).
    "tiiuae": {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
    "jamba": {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>"},
    "ai21labs": {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>"},  # Jamba
}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
]

SYSTEM = {"role": "system", "content": "You are a concise assistant. Answer in one sentence."}
TURNS = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Japan? Write \"Tokyo\" in kanji: 東京 — thanks!"},
]
TOOL_ROUND = [
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "a1b2c3d4e", "type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
    {"role": "tool", "tool_call_id": "a1b2c3d4e", "name": "get_weather", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"},
]
THINKING_HISTORY = [
    {"role": "user", "content": "Is 7 prime?"},
    {"role": "assistant", "content": "<think>\nIt has no divisors but 1 and 7.\n</think>\n\nYes, 7 is prime."},
    {"role": "user", "content": "Is 9?"},
]

# (name, messages, tools, add_generation_prompt, extra template kwargs)
CONVERSATIONS = [
    ("user_only", [TURNS[0]], None, True, {}),
    ("system_multi_turn", [SYSTEM] + TURNS, None, True, {}),
    ("system_multi_turn_no_generation_prompt", [SYSTEM] + TURNS[:2], None, False, {}),
    ("no_system_multi_turn", TURNS, None, True, {}),
    ("tools_offered", [SYSTEM, TURNS[0]], TOOLS, True, {}),
    ("tool_call_and_result", TOOL_ROUND, TOOLS, True, {}),
    ("tool_call_string_arguments", [TOOL_ROUND[0], dict(TOOL_ROUND[1], tool_calls=[{"id": "a1b2c3d4e", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]), TOOL_ROUND[2]], TOOLS, True, {}),
    ("thinking_enabled", THINKING_HISTORY, None, True, {"enable_thinking": True}),
    ("thinking_disabled", THINKING_HISTORY, None, True, {"enable_thinking": False}),
    ("content_parts", [{"role": "user", "content": [{"type": "text", "text": "Describe "},
                                                    {"type": "text", "text": "this."}]}], None, True, {}),
    ("ends_with_assistant", [SYSTEM] + TURNS[:2], None, False, {}),
    ("empty_conversation", [], None, True, {}),
]
# Fixed values for templates that read the date, so that the references do not depend on the day they were made.
COMMON_KWARGS = {"date_string": "26 Jul 2024"}


def special_tokens_for(stem):
    for prefix, tokens in SPECIAL_TOKENS.items():
        if stem.startswith(prefix):
            return tokens
    return {"bos_token": "<s>", "eos_token": "</s>"}


def compile_like_transformers(source):
    """The Jinja environment apply_chat_template renders in, for machines without transformers: sandboxed,
    trim_blocks + lstrip_blocks, loop controls, a {% generation %} tag that renders its body, tojson without HTML
    escaping, raise_exception and strftime_now. Checked: it reproduces every transformers-made file under
    fixtures/chat/rendered/ case for case (python3 scripts/make_chat_fixtures.py OUT, then compare)."""
    import jinja2
    import jinja2.ext
    from datetime import datetime
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def make_renderer():
    """Returns render(source, messages, tools, add_generation_prompt, kwargs) -> str: transformers' own, or where
    transformers is not installed, its environment rebuilt (compile_like_transformers)."""
    try:
        from transformers.utils import chat_template_utils as ctu
    except ImportError:
        def render(source, messages, tools, add_generation_prompt, kwargs):
            return compile_like_transformers(source).render(messages=messages, tools=tools, documents=None,
                                                            add_generation_prompt=add_generation_prompt, **kwargs)
        return render
    if hasattr(ctu, "render_jinja_template"):
        def render(source, messages, tools, add_generation_prompt, kwargs):
            rendered, _ = ctu.render_jinja_template(
                conversations=[messages], tools=tools, documents=None, chat_template=source,
                return_assistant_tokens_mask=False, continue_final_message=False,
                add_generation_prompt=add_generation_prompt, **kwargs)
            return rendered[0]
        return render
    compile_template = ctu._compile_jinja_template

    def render(source, messages, tools, add_generation_prompt, kwargs):
        return compile_template(source).render(messages=messages, tools=tools, documents=None,
                                               add_generation_prompt=add_generation_prompt, **kwargs)
    return render


def versions():
    import jinja2
    try:
        import transformers
        tv = transformers.__version__
    except ImportError:
        return {"transformers": None, "jinja2": jinja2.__version__, "renderer": "compile_like_transformers"}
    return {"transformers": tv, "jinja2": jinja2.__version__}


def main(outdir, render=None):
    render = render or make_renderer()
    os.makedirs(outdir, exist_ok=True)
    for name in sorted(os.listdir(TEMPLATES)):
        if not name.endswith(".jinja"):
            continue
        stem = name[: -len(".jinja")]
        with open(os.path.join(TEMPLATES, name), encoding="utf-8") as f:
            source = f.read()
        tokens = special_tokens_for(stem)
        cases = []
        for case_name, messages, tools, agp, extra in CONVERSATIONS:
            kwargs = dict(COMMON_KWARGS, **extra)
            case = {"name": case_name, "messages": messages, "tools": tools, "add_generation_prompt": agp,
                    "chat_template_kwargs": kwargs}
            try:
                # transformers passes the tokenizer's special tokens, then the caller's kwargs.
                case["output"] = render(source, messages, tools, agp, dict(tokens, **kwargs))
            except Exception as e:  # the template raised (raise_exception) or failed: the error is the reference
                case["error"] = f"{type(e).__name__}: {e}"
            cases.append(case)
        doc = {"template": "fixtures/chat/templates/" + name, "special_tokens": tokens, "made_with": versions(),
               "cases": cases}
        with open(os.path.join(outdir, stem + ".json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        ok = sum("output" in c for c in cases)
        print(f"{stem}: {ok} rendered, {len(cases) - ok} raised")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_chat_fixtures.py OUTDIR")
    main(sys.argv[1])
