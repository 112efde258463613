"""The overhead of generating from Python: tokens/s of Engine.run and of Model.generate(stream=True) against
`mambacpp generate --json` with the same model and settings (greedy, ignore EOS, one CPU thread by default).

    PYTHONPATH=build/python /usr/bin/python3 python/tools/bench_overhead.py [--cli build/mambacpp] [-n 256] [--threads 1]
"""

import argparse
import json
import statistics
import subprocess
import time

import mambacpp


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cli", default="build/mambacpp")
    p.add_argument("-n", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    prompt = "def parse_args("
    model = mambacpp.Model(device=a.device, threads=a.threads)
    engine = mambacpp.Engine(model, state_cache_mb=0)
    run, stream, cli = [], [], []
    for _ in range(a.reps):  # interleaved, so that a change in machine load hits all three alike
        r = engine.run([prompt], max_tokens=a.n, temperature=0, ignore_eos=True)[0]
        run.append(len(r.tokens) / (r.generate_ms / 1000))
        t0, first, n = time.perf_counter(), None, 0
        for _piece in model.generate(prompt, max_tokens=a.n, temperature=0, ignore_eos=True, stream=True):
            n += 1
            first = first or time.perf_counter()
        stream.append((n - 1) / (time.perf_counter() - first))  # after the first piece: decode only
        out = subprocess.run([a.cli, "generate", "--device", a.device, "-t", str(a.threads), "-p", prompt, "--temp", "0",
                              "-n", str(a.n), "--ignore-eos", "--json"], capture_output=True, text=True, check=True)
        cli.append(json.loads(out.stdout)["timings"]["generate_tokens_per_s"])
    for name, v in [("cli generate --json", cli), ("python Engine.run", run), ("python generate(stream=True)", stream)]:
        print(f"{name:30s} median {statistics.median(v):8.1f} tokens/s  ({', '.join(f'{x:.0f}' for x in v)})")


if __name__ == "__main__":
    main()
