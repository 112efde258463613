"""The prefix cache's disk tier from `mambacpp generate --state-cache-dir` and Engine(state_cache_dir=...): a run
leaves state files in the directory, and a later run (another process, another Engine) whose prompt continues an
earlier one reads its state back (cached_prompt_tokens) and generates what a run without any cache generates."""

import json
import subprocess

import pytest

import mambacpp
from conftest import cli_path, run_cli

PROMPT = "def parse_args("


def cli_generate(*args):
    return json.loads(run_cli("generate", "--device", "cpu", "--json", "--temp", "0", *args))


def state_files(d):
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".state"))


def test_cli_second_run_is_served_from_the_directory(tmp_path):
    d = tmp_path / "cache"
    first = cli_generate("-p", PROMPT, "-n", "16", "--state-cache-dir", d)
    files = state_files(d)
    assert files, f"no state file in {d}"
    # The next turn: the first prompt, what it generated, and more; written as ids so that it continues exactly.
    turn2 = first["prompt_tokens"] + first["tokens"] + first["prompt_tokens"][:3]
    tokens = tmp_path / "turn2.txt"
    tokens.write_text(" ".join(map(str, turn2)))
    second = cli_generate("--tokens-file", tokens, "-n", "8", "--state-cache-dir", d, "--state-cache-disk-mb", "64")
    assert second["cached_prompt_tokens"] >= len(first["prompt_tokens"]) + len(first["tokens"]) - 1
    fresh = cli_generate("--tokens-file", tokens, "-n", "8", "--state-cache-mb", "0")
    assert fresh["cached_prompt_tokens"] == 0
    assert second["tokens"] == fresh["tokens"]
    assert set(files) <= set(state_files(d))  # the first run's files are still there (well within the budget)


def test_cli_refuses_a_directory_without_the_memory_cache(tmp_path):
    for args, message in ((["--state-cache-dir", tmp_path / "c", "--state-cache-mb", "0"], "--state-cache-mb > 0"),
                          (["--state-cache-disk-mb", "64"], "--state-cache-dir")):
        r = subprocess.run([cli_path(), "generate", "--device", "cpu", "-p", PROMPT, "-n", "1", *map(str, args)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode != 0 and message in r.stderr, r.stderr


def test_engine_second_engine_is_served_from_the_directory(model, tmp_path):
    d = tmp_path / "cache"
    engine = mambacpp.Engine(model, state_cache_mb=64, state_cache_dir=d)
    assert engine.options["state_cache_dir"] == str(d) and engine.options["state_cache_disk_mb"] == 4096
    first = engine.run([PROMPT], max_tokens=16, temperature=0)[0]
    del engine
    assert state_files(d)
    turn2 = model.tokenizer.encode(PROMPT) + first.tokens + model.tokenizer.encode("\n")
    again = mambacpp.Engine(model, state_cache_mb=64, state_cache_dir=d, state_cache_disk_mb=32)
    r = again.run([turn2], max_tokens=8, temperature=0)[0]
    assert r.cached_prompt_tokens >= len(turn2) - 2
    fresh = mambacpp.Engine(model, state_cache_mb=0).run([turn2], max_tokens=8, temperature=0)[0]
    assert fresh.cached_prompt_tokens == 0 and r.tokens == fresh.tokens


def test_engine_reads_what_the_cli_wrote(model, tmp_path):
    d = tmp_path / "cache"
    first = cli_generate("-p", PROMPT, "-n", "16", "--state-cache-dir", d)
    turn2 = first["prompt_tokens"] + first["tokens"] + first["prompt_tokens"][:3]
    r = mambacpp.Engine(model, state_cache_mb=64, state_cache_dir=d).run([turn2], max_tokens=8, temperature=0)[0]
    assert r.cached_prompt_tokens >= len(first["prompt_tokens"]) + len(first["tokens"]) - 1


def test_engine_options_are_checked(model, tmp_path):
    with pytest.raises(mambacpp.InvalidArgumentError, match="state_cache_mb > 0"):
        mambacpp.Engine(model, state_cache_mb=0, state_cache_dir=tmp_path)
    with pytest.raises(mambacpp.InvalidArgumentError, match="needs state_cache_dir"):
        mambacpp.Engine(model, state_cache_disk_mb=64)
    with pytest.raises(mambacpp.InvalidArgumentError, match="state_cache_disk_mb"):
        mambacpp.Engine(model, state_cache_dir=tmp_path, state_cache_disk_mb=0)
