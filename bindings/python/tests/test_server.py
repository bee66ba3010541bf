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


def test_server_keys_open_routes_and_preload(tmp_path, smol_path):
    import urllib.error
    import urllib.request

    srv = mica.Server(models={"smol": smol_path}, port=0, n_threads=1, kv_mem=32 << 20,
                      api_keys=["k1"], open_routes=["/ready"], preload="smol",
                      shutdown_grace=5)
    assert not srv.ready
    with srv:
        # start() returned after the preload: ready at once.
        assert srv.ready
        with urllib.request.urlopen(srv.url + "/ready", timeout=5) as r:
            assert r.status == 200
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(srv.url + "/metrics", timeout=5)
        assert e.value.code == 401
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.base_url, api_key="wrong").models.list()
        client = openai.OpenAI(base_url=srv.base_url, api_key="k1")
        assert [m.id for m in client.models.list().data] == ["smol"]
    assert not srv.ready

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 60)
    with pytest.raises(mica.ServerError) as e:
        mica.Server(models={"bad": bad}, port=0, n_threads=1, preload=True).start()
    assert "bad" in str(e.value)
    with pytest.raises(mica.ServerError):
        mica.Server(models={"smol": smol_path}, port=0, preload="other")
    with pytest.raises(mica.InvalidParameter):
        mica.Server(models={"smol": smol_path}, port=0, open_routes=["ready"])
