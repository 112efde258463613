"""A streaming chat-style loop that keeps its state between turns.

Each turn sends the whole conversation as the prompt; the engine's exact prefix cache holds the state at the end of
the previous turn, so only the new text is prefilled (`cached` in the status line), and the result is what a fresh
run over the whole conversation would give.

    python3 examples/python/chat.py                       # type lines; an empty line ends
    python3 examples/python/chat.py "def add(a, b):" "def sub(a, b):"
"""

import sys

import mambacpp


def chat(turns, model=None, max_tokens=48):
    model = model or mambacpp.Model()
    engine = mambacpp.Engine(model, state_cache_mb=64)
    history = []  # every token so far: prompts and replies
    for text in turns:
        history += model.tokenizer.encode(text + "\n")
        with engine.stream(history, max_tokens=max_tokens, temperature=0.7, seed=len(history), stop="\n\n") as reply:
            for piece in reply:
                print(piece, end="", flush=True)
        r = reply.result
        history += r.tokens
        print(f"\n[{len(r.tokens)} tokens, {r.cached_prompt_tokens} of {r.prompt_tokens} prompt tokens cached, "
              f"{r.finish_reason}]", file=sys.stderr)
        yield r


def lines():
    while True:
        try:
            line = input("> ")
        except EOFError:
            return
        if not line:
            return
        yield line


if __name__ == "__main__":
    for _ in chat(sys.argv[1:] or lines()):
        pass
