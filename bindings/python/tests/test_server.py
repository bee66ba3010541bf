"""``mica.Server`` started from Python answers the ``openai`` SDK, and stops."""

from __future__ import annotations

import socket

import openai
import pytest

import mica


def test_server_answers_openai_sdk(model, smol_path):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    with mica.Server(models={"smol": smol_path}, port=0, n_threads=1, kv_mem=64 << 20,
                     preload=True) as srv:
        assert srv.port and srv.port > 0
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused")
        assert [m.id for m in client.models.list().data] == ["smol"]
        r = client.chat.completions.create(model="smol", messages=msgs, max_tokens=12,
                                           temperature=0)
        assert r.choices[0].message.content == model.chat(msgs, max_tokens=12, temperature=0)
        assert r.usage.completion_tokens <= 12
        stream = client.chat.completions.create(model="smol", messages=msgs, max_tokens=12,
                                                temperature=0, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == r.choices[0].message.content
        c = client.completions.create(model="smol", prompt="The capital of France is",
                                      max_tokens=6, temperature=0)
        assert c.choices[0].text == model.generate("The capital of France is", max_tokens=6,
                                                   temperature=0)
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="other", messages=msgs, max_tokens=2)
        port = srv.port
    assert srv.port is None
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_server_from_models_dir(tmp_path, smol_path):
    (tmp_path / "tiny.gguf").symlink_to(smol_path)
    srv = mica.Server(tmp_path, port=0, n_threads=1, kv_mem=32 << 20)
    assert srv.models == [("tiny", str(tmp_path / "tiny.gguf"))]
    srv.start()
    try:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused")
        assert [m.id for m in client.models.list().data] == ["tiny"]
    finally:
        srv.stop()


def test_server_errors(tmp_path, smol_path):
    with pytest.raises(mica.ServerError):
        mica.Server(tmp_path, port=0)  # no models there
    with mica.Server(models={"smol": smol_path}, port=0, n_threads=1) as srv:
        # The same port again: cannot listen.
        with pytest.raises(mica.ServerError):
            mica.Server(models={"smol": smol_path}, port=srv.port, n_threads=1).start()
