#!/usr/bin/env python3
"""Constrained decoding speed of two (or more) mica builds side by side: the JSON-schema
requests of `bench/structured_cost.py` (`records` through `/api/chat`, `fruits` through
`/api/generate`), greedy, with the server's default speculation, one server per build in
turn for `--rounds` rounds (so drift of the machine spreads over all builds), `--reps`
requests per task per round after one warm-up. Prints per build and task the median decode
tokens/s (Ollama's `eval_count` / `eval_duration`) and the drafted / accepted token counts
of one request (`draft_count`, `draft_accepted_count`). Standard library only; traffic to
127.0.0.1 only.

usage: bench/structured_ab.py --model MODEL.gguf [--threads 2] [--rounds 3] [--reps 3]
                              BIN [BIN ...]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import structured_cost as sc  # noqa: E402


def serve(binary, model, port, threads):
    p = subprocess.Popen([binary, "serve", "-m", model, "--port", str(port), "-t",
                          str(threads)], stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return p
        except OSError:
            time.sleep(0.1)
    p.terminate()
    raise SystemExit(f"{binary} did not start")


def request(port, name, task):
    if task == "records":
        url = f"http://127.0.0.1:{port}/api/chat"
        body = {"model": name, "messages": [{"role": "user", "content": sc.RECORDS_PROMPT}],
                "format": sc.RECORDS_SCHEMA}
        n = 400
    else:
        url = f"http://127.0.0.1:{port}/api/generate"
        body = {"model": name, "prompt": sc.PROMPT, "format": sc.SCHEMA}
        n = 128
    body.update(stream=False, options={"temperature": 0, "num_predict": n})
    r = sc.post(url, body)
    return (r["eval_count"] / (r["eval_duration"] / 1e9), r.get("draft_count"),
            r.get("draft_accepted_count"), r["eval_count"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--port", type=int, default=18200)
    ap.add_argument("bins", nargs="+")
    a = ap.parse_args()
    name = os.path.basename(a.model).removesuffix(".gguf")
    res = {b: [] for b in a.bins}
    for _ in range(a.rounds):
        for i, b in enumerate(a.bins):
            port = a.port + i
            p = serve(b, a.model, port, a.threads)
            try:
                request(port, name, "records")
                for task in ("records", "fruits"):
                    for _ in range(a.reps):
                        res[b].append((task,) + request(port, name, task))
            finally:
                p.terminate()
                p.wait()
    for b in a.bins:
        for task in ("records", "fruits"):
            rows = [r for r in res[b] if r[0] == task]
            print(f"{b} {name} {task}: {statistics.median(r[1] for r in rows):.1f} tok/s, "
                  f"{rows[0][4]} tokens, drafted {rows[0][2]}, accepted {rows[0][3]}")


if __name__ == "__main__":
    sys.exit(main())
