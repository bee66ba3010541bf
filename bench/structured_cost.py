#!/usr/bin/env python3
"""The cost of constrained decoding: decode tokens/s with a JSON-schema constraint vs
without, on the same prompt, from the server's own decode timing (Ollama's `eval_count` /
`eval_duration` of `/api/generate` and `/api/chat`, which exclude the prompt and the
constraint's compilation). Standard library only; traffic to 127.0.0.1 only.

Two tasks (`--task`, both by default):
- `fruits`: the schema asks for a long array (at least 200 short strings), so the
  constrained run decodes until `--n` tokens, and the free run takes the prompt the model
  answers longer (see FREE_RAW). The contents differ: the free text is a list that repeats
  its own words, which n-gram speculation drafts well — the worst case for the constraint
  under speculation.
- `records`: a chat request to turn 12 lines of "name, age, city" into a JSON array of
  objects; free, the models answer with that JSON array (in a Markdown fence), so both
  runs decode about the same text, the way an application uses a schema.

`--spec off` measures the constraint alone (with n-gram speculation, the server's default,
the constrained run also drafts the tokens the grammar forces). Runs alternate (free,
constrained) `--reps` times after one warm-up of each; the medians are reported with the
slowdown and each run's token counts.

usage: bench/structured_cost.py --mica target/release/mica --model MODEL.gguf [--threads 2]
                                [--n 128] [--reps 5] [--port 18181] [--spec off|ngram]
                                [--task fruits|records|all]
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request

SCHEMA = {"type": "object", "properties": {"fruits": {
    "type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 200}},
    "required": ["fruits"]}
PROMPT = "List as many fruits as you can, as a JSON object {\"fruits\": [...]}."
# Unconstrained runs take whichever of two prompts the model answers longer (the chat
# request above, or a raw list already begun), so that they decode about as many tokens as
# the constrained run: both then time tokens at similar context lengths.
FREE_RAW = ("A JSON object listing three hundred fruits, one per item:\n"
               "{\"fruits\": [\"apple\", \"banana\", \"cherry\", ")


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def run(url, model, n, constrained, raw=False):
    body = {"model": model, "prompt": FREE_RAW if raw else PROMPT, "raw": raw,
            "stream": False, "options": {"temperature": 0, "num_predict": n}}
    if constrained:
        body["format"] = SCHEMA
    r = post(f"{url}/api/generate", body)
    return r["eval_count"], r["eval_count"] / (r["eval_duration"] / 1e9)


PEOPLE = [("Alice Martin", 31, "Paris"), ("Bob Okafor", 45, "Lagos"), ("Chen Wei", 28, "Shanghai"),
          ("Dana Cohen", 52, "Haifa"), ("Emil Novak", 39, "Prague"), ("Fatima Zahra", 24, "Rabat"),
          ("Gustavo Lima", 61, "Recife"), ("Hana Sato", 35, "Osaka"), ("Ivan Petrov", 47, "Kazan"),
          ("Julia Berg", 29, "Bergen"), ("Kofi Mensah", 33, "Accra"), ("Lena Fischer", 56, "Graz")]
RECORDS_PROMPT = ("Convert every line of the list below into a JSON object with the keys "
                  "\"name\", \"age\" and \"city\", and put all of them in one JSON array.\n\n"
                  + "\n".join(f"{n}, {a}, {c}" for n, a, c in PEOPLE))
RECORDS_SCHEMA = {"type": "array", "items": {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "age", "city"], "additionalProperties": False}}


def run_records(url, model, n, constrained):
    body = {"model": model, "messages": [{"role": "user", "content": RECORDS_PROMPT}],
            "stream": False, "options": {"temperature": 0, "num_predict": n}}
    if constrained:
        body["format"] = RECORDS_SCHEMA
    r = post(f"{url}/api/chat", body)
    return r["eval_count"], r["eval_count"] / (r["eval_duration"] / 1e9)


def measure(label, free_run, cons_run, reps):
    free_run()
    cons_run()
    free, cons = [], []
    for _ in range(reps):
        free.append(free_run())
        cons.append(cons_run())
    f = statistics.median(r for _, r in free)
    c = statistics.median(r for _, r in cons)
    print(f"{label}: free {f:.1f} tok/s (tokens {[t for t, _ in free]}), "
          f"json-schema {c:.1f} tok/s (tokens {[t for t, _ in cons]}), "
          f"slowdown {100 * (1 - c / f):.1f}%", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mica", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--port", type=int, default=18181)
    ap.add_argument("--spec", choices=["off", "ngram"],
                    help="the server's --spec (default: its own, n-gram lookup)")
    ap.add_argument("--task", choices=["fruits", "records", "all"], default="all")
    a = ap.parse_args()
    name = a.model.rsplit("/", 1)[-1].removesuffix(".gguf")
    url = f"http://127.0.0.1:{a.port}"
    cmd = [a.mica, "serve", "-m", a.model, "--port", str(a.port), "-t", str(a.threads)]
    if a.spec:
        cmd += ["--spec", a.spec]
    srv = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        head = f"{name}, {a.threads} threads, spec {a.spec or 'default'}, {a.reps} reps"
        if a.task in ("fruits", "all"):
            raw = run(url, name, a.n, False, True)[0] > run(url, name, a.n, False)[0]
            measure(f"{head}, fruits", lambda: run(url, name, a.n, False, raw),
                    lambda: run(url, name, a.n, True), a.reps)
        if a.task in ("records", "all"):
            n = max(a.n, 400)
            measure(f"{head}, records", lambda: run_records(url, name, n, False),
                    lambda: run_records(url, name, n, True), a.reps)
    finally:
        srv.terminate()
        srv.wait()


if __name__ == "__main__":
    sys.exit(main())
