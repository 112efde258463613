#!/usr/bin/env python3
"""Load benchmark of `mambacpp serve` (docs/benchmarks.md, "Server under load").

Starts the server on a free loopback port, sends --requests streamed completions with at most --concurrency in
flight (Python asyncio, standard library only: raw HTTP/1.1 and SSE over loopback), and reports requests lost or
truncated, generated tokens/s, time to first token and inter-token latency (p50/p99), and the server's resident
memory before and after. Prompts are random token ids (lengths uniform in [--min-prompt, --max-prompt], seeded),
generation is greedy with ignore_eos, so every request must produce exactly --gen tokens, as `mambacpp bench
--serve` runs them; with --compare that benchmark runs on the same workload and the ratio is printed.

  python3 scripts/serve_load.py --binary build/mambacpp --requests 1000 --concurrency 64 --gen 64 --compare -- \\
      --device cpu --parallel 64
Everything after `--` goes to `mambacpp serve` (and, with --compare, the model options to `mambacpp bench`).
The request loop is bounded: --requests requests, each with a --timeout; it stops by itself.
"""
import argparse
import asyncio
import json
import random
import re
import subprocess
import sys
import time


def percentile(values, q):
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


async def http_get(port, path):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data.split(b"\r\n\r\n", 1)[1].decode()


async def read_chunked(reader):
    """Yields the body of a chunked HTTP response piece by piece."""
    while True:
        size = int((await reader.readline()).split(b";")[0], 16)
        if size == 0:
            return
        data = await reader.readexactly(size)
        await reader.readexactly(2)
        yield data


async def one_request(port, body, timeout):
    """One streamed completion; returns its outcome and timings."""
    out = {"ok": False, "done": False, "tokens": 0, "ttft": None, "itl": [], "finish": None, "error": None}
    payload = json.dumps(body).encode()
    t0 = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
        await writer.drain()

        async def read():
            status = (await reader.readline()).decode()
            headers = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                k, _, v = line.decode().partition(":")
                headers[k.strip().lower()] = v.strip()
            if " 200 " not in status:
                out["error"] = status.strip() + " " + (await reader.read()).decode(errors="replace")[:200]
                return
            buf, last = b"", None
            async for piece in read_chunked(reader):
                buf += piece
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    if not event.startswith(b"data: "):
                        continue  # an SSE comment (heartbeat)
                    data = event[6:]
                    if data == b"[DONE]":
                        out["done"] = True
                        continue
                    chunk = json.loads(data)
                    if "error" in chunk:
                        out["error"] = chunk["error"]["message"]
                        continue
                    if chunk.get("usage"):
                        out["tokens"] = chunk["usage"]["completion_tokens"]
                    for c in chunk["choices"]:
                        now = time.perf_counter()
                        if out["ttft"] is None:
                            out["ttft"] = (now - t0) * 1000
                        else:
                            out["itl"].append((now - last) * 1000)
                        last = now
                        if c.get("finish_reason"):
                            out["finish"] = c["finish_reason"]
            out["ok"] = True

        await asyncio.wait_for(read(), timeout)
        writer.close()
    except Exception as e:  # counted as lost, with the reason
        out["error"] = f"{type(e).__name__}: {e}"
    return out


async def run_load(port, args):
    rng = random.Random(args.seed)
    bodies = [{
        "prompt": [rng.randrange(args.vocab) for _ in range(rng.randint(args.min_prompt, args.max_prompt))],
        "max_tokens": args.gen, "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    } for _ in range(args.requests)]
    queue = asyncio.Queue()
    for b in bodies:
        queue.put_nowait(b)
    results = []
    max_running = 0

    async def worker():
        while not queue.empty():
            results.append(await one_request(port, queue.get_nowait(), args.timeout))

    async def poll_running(stop):
        nonlocal max_running
        while not stop.is_set():
            m = re.search(r"^mambacpp_requests_running (\d+)", await http_get(port, "/metrics"), re.M)
            max_running = max(max_running, int(m.group(1)))
            await asyncio.sleep(0.1)

    stop = asyncio.Event()
    poller = asyncio.create_task(poll_running(stop))
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    wall = time.perf_counter() - t0
    stop.set()
    await poller
    return results, wall, max_running


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default="build/mambacpp")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--gen", type=int, default=64, help="tokens generated per request")
    p.add_argument("--min-prompt", type=int, default=16)
    p.add_argument("--max-prompt", type=int, default=128)
    p.add_argument("--vocab", type=int, default=4096, help="prompt token ids are drawn from [0, vocab)")
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--timeout", type=float, default=300, help="seconds one request may take")
    p.add_argument("--compare", action="store_true", help="also run `mambacpp bench --serve` on the same workload")
    p.add_argument("--json", action="store_true")
    p.add_argument("serve_args", nargs="*", help="after --: arguments of `mambacpp serve`")
    args = p.parse_args()

    server = subprocess.Popen([args.binary, "serve", "--host", "127.0.0.1", "--port", "0", *args.serve_args],
                              stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/v1 ready", line)
        if not m:
            sys.exit(f"the server did not start: {line!r}")
        port = int(m.group(1))
        rss_before = rss_mib(server.pid)
        results, wall, max_running = asyncio.run(run_load(port, args))
        rss_after = rss_mib(server.pid)
        metrics = asyncio.run(http_get(port, "/metrics"))
    finally:
        server.terminate()
        server.wait(timeout=10)

    lost = [r for r in results if not r["ok"] or r["error"]]
    truncated = [r for r in results if r["ok"] and not r["error"] and
                 (not r["done"] or r["tokens"] != args.gen or r["finish"] != "length")]
    generated = sum(r["tokens"] for r in results)
    ttft = [r["ttft"] for r in results if r["ttft"] is not None]
    itl = [x for r in results for x in r["itl"]]
    cache = {k: int(float(v)) for k, v in re.findall(r"^mambacpp_(cache_bytes|cache_budget_bytes) (\S+)", metrics, re.M)}
    report = {
        "requests": args.requests, "concurrency": args.concurrency, "gen": args.gen,
        "prompt_tokens": [args.min_prompt, args.max_prompt], "serve_args": args.serve_args,
        "lost": len(lost), "truncated": len(truncated), "wall_s": wall,
        "generated_tokens": generated, "generated_tokens_per_s": generated / wall,
        "ttft_ms_p50": percentile(ttft, 0.5), "ttft_ms_p99": percentile(ttft, 0.99),
        "itl_ms_p50": percentile(itl, 0.5), "itl_ms_p99": percentile(itl, 0.99),
        "max_running": max_running, "rss_mib_before": rss_before, "rss_mib_after": rss_after,
        "cache_bytes": cache.get("cache_bytes"), "cache_budget_bytes": cache.get("cache_budget_bytes"),
        "errors": sorted({str(r["error"]) for r in lost})[:5],
    }
    if args.compare:
        model_args, it = [], iter(args.serve_args)
        for a in it:  # the model options of serve that bench takes too
            if a in ("--device", "--dtype", "--state-dtype", "--model", "-m", "--shape", "--batch-tokens", "-t",
                     "--threads"):
                model_args += [a, next(it)]
            elif a in ("--no-cuda-graph", "--no-fused-decode"):
                model_args.append(a)
        if not any(a in model_args for a in ("--model", "-m", "--shape")):
            model_args += ["--model", "models/default"]
        bench = subprocess.run(
            [args.binary, "bench", "--serve", *model_args, "--requests", str(args.requests),
             "--max-seqs", str(args.concurrency), "--gen", str(args.gen), "--min-prompt", str(args.min_prompt),
             "--max-prompt", str(args.max_prompt), "--repeat", "1", "--json"],
            capture_output=True, text=True, check=True)
        b = json.loads(bench.stdout)
        report["bench_serve"] = {k: b[k] for k in ("generated_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99",
                                                   "itl_ms_p50", "itl_ms_p99", "wall_ms")}
        report["server_vs_bench"] = report["generated_tokens_per_s"] / b["generated_tokens_per_s"]
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:24} {v:.2f}" if isinstance(v, float) else f"{k:24} {v}")
    return 1 if lost or truncated else 0


if __name__ == "__main__":
    sys.exit(main())
