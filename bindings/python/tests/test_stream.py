"""Streaming: the same text as ``generate``, and leaving the loop early cancels the request
and frees its sequence (the engine's metrics say so, and the next request runs)."""

from __future__ import annotations

import time

import mica


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_stream_joins_to_generate(model):
    kw = dict(max_tokens=32, temperature=0)
    chunks = list(model.stream("Once upon a time, in a small village by the sea,", **kw))
    assert len(chunks) > 4
    assert "".join(chunks) == model.generate(
        "Once upon a time, in a small village by the sea,", **kw
    )


# Longer than a few KV blocks, so its prefix is cached whole blocks at a time.
LONG = ("You are a storyteller who writes long, detailed tales about sailors, storms, "
        "lighthouses and the creatures of the deep, always in the present tense. "
        "Write a very long story about the sea.")


def test_early_break_frees_the_sequence(smol_path):
    # A model of its own, so no other test's requests are counted.
    m = mica.Model(smol_path, n_threads=1, kv_mem=32 << 20)
    got = []
    for text in m.stream(LONG, max_tokens=400,
                         temperature=0, ignore_eos=True):
        got.append(text)
        if len(got) == 3:
            break
    assert len(got) == 3
    # The engine sees the request cancelled and releases its KV blocks at its next step.
    assert wait_for(lambda: m.metrics()["requests"]["cancelled"] == 1), m.metrics()
    met = m.metrics()
    assert met["running"] == 0 and met["waiting"] == 0
    assert met["kv_blocks_used"] == 0, met
    assert met["generated_tokens"] < 50, "the request went on after the break"
    # A follow-up request runs (and reuses the cached prompt prefix).
    out = m.create_completion(LONG, max_tokens=4,
                              temperature=0, ignore_eos=True)
    assert out["usage"]["completion_tokens"] == 4
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert m.metrics()["requests"]["ok"] == 1


def test_closing_a_held_generator_cancels(smol_path):
    m = mica.Model(smol_path, n_threads=1, kv_mem=32 << 20)
    gen = m.stream("Count from one to a thousand:", max_tokens=400, temperature=0,
                   ignore_eos=True)
    next(gen)
    gen.close()
    assert wait_for(lambda: m.metrics()["requests"]["cancelled"] == 1), m.metrics()
    assert wait_for(lambda: m.metrics()["kv_blocks_used"] == 0), m.metrics()


def test_chat_stream(model):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    streamed = "".join(model.chat(msgs, stream=True, max_tokens=16, temperature=0))
    assert streamed == model.chat(msgs, max_tokens=16, temperature=0)
    assert len(streamed) > 10
