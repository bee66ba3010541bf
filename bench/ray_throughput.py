#!/usr/bin/env python3
"""Aggregate throughput of mica on Ray Serve (deploy/ray) with 1 and with 2 replicas:
8 clients send chat requests through the OpenAI SDK for a fixed time; the script prints
completion tokens per second and requests per second for each replica count.

Each replica gets ``--threads`` compute threads (1 by default, so 2 replicas use 2 cores).
The prompts differ from each other (no shared prefix), so the router spreads them by load.

    bindings/python/.venv/bin/python bench/ray_throughput.py -m models/smollm2-135m-instruct-q4_1.gguf

Needs the package and ray[serve] in the interpreter (scripts/test-python installs both
into bindings/python/.venv).
"""

import argparse
import os
import socket
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAY_DIR = os.path.join(REPO, "deploy", "ray")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, timeout=180):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    sys.exit("Ray Serve did not become ready")


def run_clients(base_url, clients, seconds, max_tokens):
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    stop_at = time.monotonic() + seconds
    lock = threading.Lock()
    totals = {"requests": 0, "tokens": 0}

    def worker(k):
        i = 0
        while time.monotonic() < stop_at:
            r = client.chat.completions.create(
                model="bench", max_tokens=max_tokens, temperature=0.7, seed=k * 1000 + i,
                messages=[{"role": "user",
                           "content": f"Client {k}, request {i}: tell me a short story."}])
            i += 1
            with lock:
                totals["requests"] += 1
                totals["tokens"] += r.usage.completion_tokens

    t0 = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(worker, range(clients)))
    return totals, time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True, help="model path or store name")
    ap.add_argument("--replicas", default="1,2", help="replica counts to measure")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="compute threads per replica")
    args = ap.parse_args()

    sys.path.insert(0, RAY_DIR)
    import ray
    from ray import serve

    import mica_serve

    counts = [int(x) for x in args.replicas.split(",")]
    ray.init(num_cpus=max(counts) * args.threads + 2, include_dashboard=False,
             log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([RAY_DIR, *sys.path])}})
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    url = f"http://127.0.0.1:{port}"
    results = []
    try:
        for n in counts:
            app = mica_serve.build_app({"model": args.model, "replicas": n,
                                        "threads": args.threads, "name": "bench"})
            serve.run(app, name="mica", route_prefix="/", blocking=False)
            wait_ready(url)
            run_clients(url + "/v1", args.clients, 3, args.max_tokens)  # warm-up
            totals, secs = run_clients(url + "/v1", args.clients, args.seconds, args.max_tokens)
            results.append((n, totals["tokens"] / secs, totals["requests"] / secs))
            print(f"{n} replica(s), {args.clients} clients, {args.threads} thread(s) each: "
                  f"{totals['tokens'] / secs:.1f} completion tokens/s, "
                  f"{totals['requests'] / secs:.2f} requests/s over {secs:.1f} s", flush=True)
            serve.delete("mica")
    finally:
        serve.shutdown()
        ray.shutdown()
    if len(results) >= 2:
        base = results[0][1]
        for n, tps, _ in results[1:]:
            print(f"{n} vs {results[0][0]} replica(s): {tps / base:.2f}x tokens/s")


if __name__ == "__main__":
    main()
