"""One ``Model`` used from several Python threads at once: every thread gets the answer it
would get alone (greedy), the engine batches them, and the GIL is released while they
compute (a Python thread keeps running meanwhile)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import mica

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at",
    "The largest planet in the solar system is",
]


def test_concurrent_threads_match_sequential(smol_path):
    m = mica.Model(smol_path, n_threads=1, kv_mem=64 << 20)
    kw = dict(max_tokens=24, temperature=0, ignore_eos=True)
    alone = [m.generate(p, **kw) for p in PROMPTS]
    steps_alone = m.metrics()["steps"]

    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.005)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            together = list(pool.map(lambda p: m.generate(p, **kw), PROMPTS))
            streamed = list(pool.map(lambda p: "".join(m.stream(p, **kw)), PROMPTS))
    finally:
        stop.set()
        t.join()
    assert together == alone
    assert streamed == alone
    # Batched: the concurrent runs took far fewer engine steps than one request at a time.
    steps_together = m.metrics()["steps"] - steps_alone
    assert steps_together < 2 * steps_alone, (steps_together, steps_alone)
    # The GIL was free: the ticker thread kept ticking while the others generated.
    assert len(ticks) > 20


def test_logits_from_threads(model):
    ids = model.tokenize("The capital of France is")
    ref = model.logits(ids).tobytes()
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda _: model.logits(ids).tobytes(), range(8)))
    assert all(o == ref for o in outs)
