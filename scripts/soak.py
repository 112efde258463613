#!/usr/bin/env python3
"""Soak test of `mambacpp serve`: N minutes at concurrency C with random client disconnects.

Starts the server (the shipped model unless --model; or attaches to --url and --pid) and runs C clients in a loop:
plain completions, streamed ones, and streams the client drops (right after sending, or after a few events). Every
request that was not dropped must complete whole: status 200, finish_reason "length" and exactly max_tokens tokens
(ignore_eos), a stream ending in its usage chunk and [DONE]. It samples the server's resident memory (VmRSS from
/proc/PID/status) and checks /metrics at the end: requests_total grew by the requests sent, requests_rejected_total by
the 503s seen, requests_cancelled_total by no more than the drops.

Exit status 0 when nothing was lost or truncated, /metrics agrees, and the resident memory after warm-up (the first
--warmup fraction of the run) grew by less than --max-rss-growth-mb. Standard library only.

  python3 scripts/soak.py --binary build/mambacpp --minutes 10 --concurrency 64 --json soak.json
"""
import argparse
import http.client
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request


def read_rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def read_cpu(pid):
    """The server's user + system CPU seconds and its minor page faults: per request, costs that other load on the
    machine changes less than the requests per second (faults count what mmapped allocations cost)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])


def read_memory_breakdown(pid):
    """Resident MB by kind of mapping: thread stacks (glibc's 8 MiB stacks), the main heap, other anonymous memory
    (malloc's per-thread arenas and its mmaps of large blocks: tensors, states, cache entries) and files."""
    out = {"stacks": 0, "main_heap": 0, "other_anon": 0, "files": 0}
    kind, size = None, 0
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if re.match(r"^[0-9a-f]+-[0-9a-f]+$", head[0]):
                name = head[5] if len(head) > 5 else ""
                kind = ("main_heap" if name == "[heap]" else "files" if name.startswith("/")
                        else "stacks" if name == "[stack]" else None)
            elif head[0] == "Size:":
                size = int(head[1])
                if kind is None and size == 8192:
                    kind = "stacks"
            elif head[0] == "Rss:":
                out[kind or "other_anon"] += int(head[1])
    return {k: round(v / 1024, 1) for k, v in out.items()}


def read_metrics(url):
    text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(mambacpp_\w+) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def start_server(args):
    cmd = [args.binary, "serve", "--device", "cpu", "--host", "127.0.0.1", "--port", "0",
           "--parallel", str(args.concurrency), "--state-cache-mb", str(args.state_cache_mb)]
    if args.model:
        cmd += ["--model", args.model]
    cmd += args.server_arg
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    deadline = time.time() + 60
    for line in proc.stdout:
        m = re.search(r"(http://127\.0\.0\.1:\d+)/v1 ready", line)
        if m:
            # Keep draining stdout so that the server never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, m.group(1)
        if time.time() > deadline:
            break
    proc.kill()
    sys.exit(f"the server did not start: {' '.join(cmd)}")


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {"sent": 0, "plain": 0, "stream": 0, "dropped": 0, "rejected_503": 0, "lost": 0}
        self.failures = []

    def add(self, key, n=1):
        with self.lock:
            self.counts[key] += n

    def fail(self, what):
        with self.lock:
            self.counts["lost"] += 1
            if len(self.failures) < 20:
                self.failures.append(what)


PREFIXES = [f"def handler_{i}(request, " for i in range(16)] + [f"class Worker{i}:\n    def " for i in range(16)]


def one_request(host, port, rng, stats, drop_rate):
    max_tokens = rng.randint(8, 48)
    prompt = rng.choice(PREFIXES) + rng.choice(["", "x", "y, z", "timeout=3"])
    r = rng.random()
    kind = "plain" if r < 0.4 else "stream" if r < 0.4 + 0.6 * (1 - drop_rate) else "drop"
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": rng.choice([0, 0.8]), "seed": rng.randint(0, 1 << 30)}
    if kind != "plain":
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    conn = http.client.HTTPConnection(host, port, timeout=300)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        stats.add("sent")
        if kind == "drop":
            # The client goes away: before reading anything, or after a few events of its stream.
            events = rng.choice([0, 0, 1, 2, 4])
            if events:
                resp = conn.getresponse()
                for _ in range(events):
                    if not resp.fp.readline():
                        break
            stats.add("dropped")
            return
        resp = conn.getresponse()
        data = resp.read().decode()
        if resp.status == 503:
            stats.add("rejected_503")
            return
        if resp.status != 200:
            stats.fail(f"{kind}: status {resp.status}: {data[:200]}")
            return
        if kind == "plain":
            j = json.loads(data)
            if j["usage"]["completion_tokens"] != max_tokens or j["choices"][0]["finish_reason"] != "length":
                stats.fail(f"plain truncated: {j['usage']} {j['choices'][0]['finish_reason']}")
                return
        else:
            events = [e[6:] for e in data.split("\n\n") if e.startswith("data: ")]
            if not events or events[-1] != "[DONE]":
                stats.fail(f"stream without [DONE]: ...{data[-200:]!r}")
                return
            usage = json.loads(events[-2]).get("usage") if len(events) >= 2 else None
            finish = [c.get("finish_reason") for e in events[:-1] for c in json.loads(e).get("choices", [])]
            if not usage or usage["completion_tokens"] != max_tokens or "length" not in finish:
                stats.fail(f"stream truncated: usage {usage}, finish reasons {set(finish)}")
                return
        stats.add(kind)
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        stats.fail(f"{kind}: {type(e).__name__}: {e}")
    finally:
        conn.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--binary", default="build/mambacpp")
    p.add_argument("--model", help="model directory (default: the shipped model)")
    p.add_argument("--url", help="a running server (with --pid) instead of starting one")
    p.add_argument("--pid", type=int, help="the running server's process id, for its resident memory")
    p.add_argument("--minutes", type=float, default=1.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--drop-rate", type=float, default=0.2, help="fraction of streams the client drops")
    p.add_argument("--state-cache-mb", type=int, default=64,
                   help="the server's prefix cache budget: small, so that it is full within the warm-up")
    p.add_argument("--server-arg", action="append", default=[], help="one more argument for `serve`")
    p.add_argument("--rss-every", type=float, default=2.0, help="seconds between resident memory samples")
    p.add_argument("--warmup", type=float, default=0.25, help="fraction of the run before memory must be flat")
    p.add_argument("--max-rss-growth-mb", type=float, default=32.0)
    p.add_argument("--memory-breakdown", action="store_true",
                   help="with each memory sample: resident MB by mapping (stacks, heap, arenas) and the allocator's "
                        "live and free heap from /metrics, printed to stderr and kept in --json")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the figures (and the memory samples) to this file")
    args = p.parse_args()

    proc = None
    if args.url:
        if not args.pid:
            sys.exit("--url needs --pid (the resident memory is read from /proc/PID/status)")
        url, pid = args.url.rstrip("/"), args.pid
    else:
        proc, url = start_server(args)
        pid = proc.pid
    host, port = url[len("http://"):].split(":")
    port = int(port)

    stats = Stats()
    before = read_metrics(url)
    cpu_before, faults_before = read_cpu(pid)
    start = time.time()
    end = start + args.minutes * 60
    samples = []  # (seconds, VmRSS kB)
    stop = threading.Event()

    memory = []  # (seconds, VmRSS MB, breakdown by mapping, the allocator's live and free heap MB)

    def sampler():
        while not stop.is_set():
            t = round(time.time() - start, 1)
            samples.append((t, read_rss_kb(pid)))
            if args.memory_breakdown:
                m = read_metrics(url)
                memory.append({"t": t, "rss_mb": round(samples[-1][1] / 1024, 1), **read_memory_breakdown(pid),
                               "heap_in_use_mb": round(m.get("mambacpp_heap_in_use_bytes", 0) / 2**20, 1),
                               "heap_free_mb": round(m.get("mambacpp_heap_free_bytes", 0) / 2**20, 1)})
                print(json.dumps(memory[-1]), file=sys.stderr, flush=True)
            stop.wait(args.rss_every)

    def worker(i):
        rng = random.Random(args.seed * 1000 + i)
        while time.time() < end:
            one_request(host, port, rng, stats, args.drop_rate)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.concurrency)]
    sampling = threading.Thread(target=sampler, daemon=True)
    sampling.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    # Dropped requests are cancelled at the server's next step: wait until nothing runs before counting.
    settle = time.time() + 30
    while time.time() < settle:
        m = read_metrics(url)
        if m["mambacpp_requests_running"] == 0 and m["mambacpp_requests_queued"] == 0:
            break
        time.sleep(0.1)
    samples.append((round(time.time() - start, 1), read_rss_kb(pid)))
    stop.set()
    after = read_metrics(url)
    cpu_after, faults_after = read_cpu(pid)
    cpu_seconds, faults = cpu_after - cpu_before, faults_after - faults_before
    delta = {k: after[k] - before.get(k, 0) for k in after if k.endswith("_total")}
    c = stats.counts
    problems = list(stats.failures)
    if c["lost"]:
        problems.append(f"{c['lost']} requests lost or truncated")
    if delta["mambacpp_requests_total"] + delta["mambacpp_requests_rejected_total"] != c["sent"]:
        problems.append(f"/metrics counted {delta['mambacpp_requests_total']:.0f} requests and "
                        f"{delta['mambacpp_requests_rejected_total']:.0f} rejected, the clients sent {c['sent']}")
    if delta["mambacpp_requests_rejected_total"] != c["rejected_503"]:
        problems.append(f"/metrics counted {delta['mambacpp_requests_rejected_total']:.0f} rejected, "
                        f"the clients saw {c['rejected_503']} 503s")
    if delta["mambacpp_requests_cancelled_total"] > c["dropped"]:
        problems.append(f"/metrics counted {delta['mambacpp_requests_cancelled_total']:.0f} cancelled, "
                        f"the clients dropped {c['dropped']}")
    if after["mambacpp_requests_running"] != 0:
        problems.append(f"{after['mambacpp_requests_running']:.0f} requests still running 30 s after the load")

    warm = [kb for t, kb in samples if t >= args.warmup * args.minutes * 60]
    rss = {"first_mb": samples[0][1] / 1024, "after_warmup_mb": warm[0] / 1024, "min_after_warmup_mb": min(warm) / 1024,
           "max_after_warmup_mb": max(warm) / 1024, "last_mb": warm[-1] / 1024, "samples": len(samples)}
    growth = (warm[-1] - warm[0]) / 1024
    if growth > args.max_rss_growth_mb:
        problems.append(f"resident memory grew by {growth:.1f} MB after warm-up (limit {args.max_rss_growth_mb})")

    elapsed = time.time() - start
    if proc:
        # SIGTERM drains (nothing is in flight now): the server must exit 0, promptly.
        proc.terminate()
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "still running 30 s after SIGTERM"
        if code != 0:
            problems.append(f"the server's exit after SIGTERM: {code}")
    report = {"minutes": round(elapsed / 60, 2), "concurrency": args.concurrency, "counts": c,
              "requests_per_second": round((c["plain"] + c["stream"] + c["dropped"]) / elapsed, 1),
              "server_cpu_ms_per_request": round(1000 * cpu_seconds / max(1, c["sent"]), 2),
              "server_cpu_ms_per_generated_token":
                  round(1000 * cpu_seconds / max(1, delta["mambacpp_generated_tokens_total"]), 3),
              "server_page_faults_per_generated_token":
                  round(faults / max(1, delta["mambacpp_generated_tokens_total"]), 2),
              "metrics_delta": {k[len("mambacpp_"):]: v for k, v in delta.items()},
              "cancelled_by_server": delta["mambacpp_requests_cancelled_total"],
              "cache_at_end": {k[len("mambacpp_"):]: after[k] for k in
                               ("mambacpp_cache_entries", "mambacpp_cache_bytes", "mambacpp_cache_budget_bytes")},
              "rss": {k: round(v, 1) if isinstance(v, float) else v for k, v in rss.items()},
              "problems": problems}
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**report, "rss_samples": samples, "memory_samples": memory}, f, indent=1)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
