#!/usr/bin/env python3
"""Load tests for `mica serve` (standard library only; traffic to 127.0.0.1 only).

mixed:       3 bulk requests (long prompts, 256 new tokens) queued first, then 3 interactive
             requests (50 ms apart); reports their time-to-first-token (p50, max) for the
             server as started, and that of the same 3 requests, sent the same way, on the
             idle server just before.
throughput:  aggregate generated tokens/s with 1, 4, 8, 16 concurrent streaming clients.

Start the server yourself (e.g. `mica serve -m MODEL --scheduler fifo --port 8091`) or let
the script start it with --mica BIN --model GGUF [--scheduler priority|fifo]. Any server
with OpenAI's /v1/completions works (e.g. llama.cpp's), given --url and --model-name.
Every loop is bounded in requests and time.

Charts: `--json-out F` keeps the mixed test's per-request timeline; `bench/charts.py serve-load
FIFO.json PRIORITY.json OUT.svg` draws both schedulers side by side (`--chart OUT` draws one).
"""

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse


def stream_completion(url, model, prompt, max_tokens, priority=None, timeout=600):
    """Streams one completion; returns (ttft_s, total_s, completion_tokens)."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if priority:
        body["priority"] = priority
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    ttft, tokens, chunks = None, None, 0
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        ev = json.loads(data)
        if ev.get("choices") and ttft is None:
            ttft = time.perf_counter() - t0
        if ev.get("choices"):
            chunks += 1
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
    total = time.perf_counter() - t0
    conn.close()
    return ttft, total, tokens if tokens is not None else chunks


def long_prompt(i, words):
    return f"Report {i}. " + " ".join(f"item{(i * 31 + k) % 997}" for k in range(words)) + "\nSummary:"


INTERACTIVE = [f"Question {i}: name a fruit." for i in range(3)]


# Every request of the mixed test: lane ("idle": the burst on the idle server, "bulk",
# "interactive"), when it was sent (seconds from the test's start) and its TTFT.
TIMELINE = []
T0 = time.perf_counter()


def interactive_burst(args, lane="interactive"):
    """The 3 interactive requests, 50 ms apart, concurrently; their TTFTs sorted. The prompts
    stay under one 16-token KV block, so a second burst gets nothing from the prefix cache."""
    ttfts = []

    def one(p):
        sent = time.perf_counter() - T0
        ttft = stream_completion(args.url, args.model_name, p, 16, "interactive")[0]
        ttfts.append(ttft)
        TIMELINE.append({"lane": lane, "sent_s": round(sent, 4), "ttft_s": ttft})

    ts = [threading.Thread(target=one, args=(p,)) for p in INTERACTIVE]
    for t in ts:
        t.start()
        time.sleep(0.05)
    for t in ts:
        t.join()
    return sorted(ttfts)


def mixed(args):
    res = {}
    # Warm-up (not measured): the first forward passes fault the mapped weights in.
    for _ in range(2):
        stream_completion(args.url, args.model_name, "Warm-up: say hello.", 4, "interactive")
    global T0
    T0 = time.perf_counter()
    # Idle: the very same interactive burst on the idle server.
    idle = interactive_burst(args, "idle")
    bulk_threads = []

    def bulk(i):
        sent = time.perf_counter() - T0
        ttft = stream_completion(args.url, args.model_name, long_prompt(i, args.bulk_words), 256, "bulk")[0]
        TIMELINE.append({"lane": "bulk", "sent_s": round(sent, 4), "ttft_s": ttft})

    for i in range(3):
        t = threading.Thread(target=bulk, args=(i,))
        t.start()
        bulk_threads.append(t)
        time.sleep(0.05)
    time.sleep(args.delay)
    inter = interactive_burst(args)
    res["idle_ttft_s"] = [round(x, 4) for x in idle]
    res["interactive_ttft_s"] = [round(x, 4) for x in inter]
    res["interactive_ttft_p50_s"] = statistics.median(inter)
    res["interactive_ttft_max_s"] = max(inter)
    res["idle_ttft_p50_s"] = statistics.median(idle)
    res["idle_ttft_max_s"] = max(idle)
    res["p50_vs_idle"] = round(statistics.median(inter) / statistics.median(idle), 2)
    t0 = time.perf_counter()
    for t in bulk_threads:
        t.join()
    res["bulk_finished_after_s"] = time.perf_counter() - t0
    res["requests"] = sorted(TIMELINE, key=lambda q: q["sent_s"])
    return res


def throughput(args):
    out = {}
    stream_completion(args.url, args.model_name, "Warm-up: say hello.", 4)
    for n in args.clients:
        tokens = []
        lock = threading.Lock()

        def client(i):
            for r in range(args.requests_per_client):
                _, _, k = stream_completion(args.url, args.model_name,
                                            f"Story {i}-{r}: Once upon a time", args.gen_tokens)
                with lock:
                    tokens.append(k)

        t0 = time.perf_counter()
        ts = [threading.Thread(target=client, args=(i,)) for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall = time.perf_counter() - t0
        out[n] = {"tokens": sum(tokens), "wall_s": round(wall, 2),
                  "tokens_per_s": round(sum(tokens) / wall, 1)}
        print(f"  {n:2d} clients: {out[n]}", file=sys.stderr)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["mixed", "throughput"])
    ap.add_argument("--url", default="http://127.0.0.1:8091")
    ap.add_argument("--model-name")
    ap.add_argument("--mica", help="mica binary to start (else the server at --url is used)")
    ap.add_argument("--model", help="GGUF for --mica")
    ap.add_argument("--scheduler", default="priority")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bulk-words", type=int, default=450, help="words per bulk prompt (~2 tokens each)")
    ap.add_argument("--delay", type=float, default=0.5, help="seconds between bulk and interactive")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--requests-per-client", type=int, default=1)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--json-out", help="also write the result (mixed: with every request's timeline) to this file")
    ap.add_argument("--chart", help="mixed: draw the requests' TTFT over time (bench/charts.py serve-load; "
                    "SVG or PNG by extension); give several --json-out files to charts.py to compare schedulers")
    args = ap.parse_args()
    proc = None
    if args.mica:
        port = urllib.parse.urlparse(args.url).port
        proc = subprocess.Popen([args.mica, "serve", "-m", args.model, "--port", str(port),
                                 "--scheduler", args.scheduler, "-t", str(args.threads)],
                                stderr=subprocess.DEVNULL)
        args.model_name = args.model_name or args.model.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.1)
    try:
        res = mixed(args) if args.mode == "mixed" else throughput(args)
        doc = {"mode": args.mode, "scheduler": args.scheduler, **{str(k): v for k, v in res.items()}}
        print(json.dumps(doc, indent=1))
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(doc, f, indent=1)
        if args.chart and args.mode == "mixed":
            data = args.json_out or args.chart.rsplit(".", 1)[0] + ".json"
            if not args.json_out:
                with open(data, "w") as f:
                    json.dump(doc, f, indent=1)
            import os
            here = os.path.dirname(os.path.abspath(__file__))
            subprocess.run([sys.executable, os.path.join(here, "charts.py"), "--setup", "serve-load",
                            data, args.chart], check=True)
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
