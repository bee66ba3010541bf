#!/usr/bin/env python3
"""What the Python package costs over the ``mica`` binary: greedy decode speed of the same
prompt and length through ``mica run`` (its own ``--json`` timings) and through
``mica.Model`` (the engine's event stream that ``stream`` iterates, timed from the first
token to the last, so load and prompt evaluation are left out on both sides; and
``create_completion`` as a whole). Alternates between them for ``--rounds`` rounds and
prints the medians.

    bindings/python/.venv/bin/python bench/python_overhead.py \\
        -m models/smollm2-135m-instruct-q4_1.gguf --mica target/release/mica

Both sides must be built the same way to compare (``--mica target/release/mica`` with a
package from ``maturin develop --release``, or target/debug with ``--profile dev``, which
``scripts/test-python`` builds).
"""

import argparse
import json
import statistics
import subprocess
import time

PROMPT = "Once upon a time, in a small village by the sea,"


def cli_tps(mica_bin, model, n, threads):
    out = subprocess.run(
        [mica_bin, "run", "-m", model, "-p", PROMPT, "-n", str(n), "--temp", "0",
         "--ignore-eos", "-t", str(threads), "--json"],
        check=True, capture_output=True, text=True).stdout
    t = json.loads(out)["timings"]
    # gen_ms covers the tokens after the first (the first comes from prompt evaluation).
    return t["gen_tokens_per_s"]


def py_tps(model, n):
    """Tokens per second after the first token, as the CLI counts them: the engine's event
    stream read from Python (what ``Model.stream`` iterates)."""
    kw = dict(max_tokens=n, temperature=0, ignore_eos=True)
    events = model._native.submit(model.tokenize(PROMPT), **kw)
    first = last = None
    count = 0
    for ev in events:
        if ev[0] == "token":
            now = time.perf_counter()
            if first is None:
                first = now
            last = now
            count += 1
    return (count - 1) / (last - first)


def py_generate_tps(model, n):
    """``generate`` wall-clock per generated token, prompt included (an upper bound)."""
    t0 = time.perf_counter()
    out = model.create_completion(PROMPT, max_tokens=n, temperature=0, ignore_eos=True)
    dt = time.perf_counter() - t0
    return out["usage"]["completion_tokens"] / dt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--mica", default="target/release/mica", help="the mica binary")
    ap.add_argument("-n", type=int, default=128, help="tokens to generate")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    import mica

    model = mica.Model(args.model, n_threads=args.threads)
    py_tps(model, 8)  # start the engine, warm the caches
    cli, events, whole = [], [], []
    for _ in range(args.rounds):
        cli.append(cli_tps(args.mica, args.model, args.n, args.threads))
        events.append(py_tps(model, args.n))
        whole.append(py_generate_tps(model, args.n))
    c, e, w = (statistics.median(x) for x in (cli, events, whole))
    print(f"{args.n} tokens, {args.threads} thread(s), median of {args.rounds}:")
    print(f"  mica run (CLI, its timings)            {c:8.1f} tokens/s")
    print(f"  mica.Model event stream (Python)       {e:8.1f} tokens/s  ({e / c:.3f}x)")
    print(f"  mica.Model.create_completion, whole    {w:8.1f} tokens/s  ({w / c:.3f}x, "
          "prompt included)")


if __name__ == "__main__":
    main()
