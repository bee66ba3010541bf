"""The ``anthropic`` SDK against ``mica serve``'s Messages API (``/v1/messages``): whole
answers, structured output (``output_config``), ``messages.stream`` (its text stream and the final message it accumulates from the
events), ``count_tokens``, errors as the SDK's exception classes, and a tool-use round trip
(a forced call whose input fits the schema, then a ``tool_result`` that continues) on
Qwen2.5-Coder, whose chat template renders tools. The server is the ``mica`` binary, started
with an API key that the SDK sends as ``x-api-key``."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request

import anthropic
import pytest

from conftest import SMOL, THREADS, models_dir

QWEN = "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf"
KEY = "test-key"
SMOL_NAME = SMOL.removesuffix(".gguf")
QWEN_NAME = QWEN.removesuffix(".gguf")
# Greedy decoding. Recent SDKs no longer take `temperature` as an argument; the server
# still reads it from the body.
GREEDY = {"temperature": 0}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 30},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
    },
}


@pytest.fixture(scope="module")
def base_url(tmp_path_factory, mica_bin):
    models = models_dir()
    if not (models / QWEN).is_file():
        pytest.fail(f"{models / QWEN} is missing: run scripts/fetch-test-models")
    folder = tmp_path_factory.mktemp("models")
    for name in (SMOL, QWEN):
        (folder / name).symlink_to(models / name)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [str(mica_bin), "serve", "--models-dir", str(folder), "--port", str(port),
         "--api-key", KEY, "--threads", str(THREADS), "--kv-mem", "64M", "--max-loaded", "2",
         "--ctx-size", "2048"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mica serve did not start: {proc.poll()}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def client(base_url):
    return anthropic.Anthropic(base_url=base_url, api_key=KEY, max_retries=0, timeout=300)


def test_create_stream_and_count(client):
    r = client.messages.create(model=SMOL_NAME, max_tokens=16, extra_body=GREEDY,
                               messages=QUESTION, system="Answer briefly.")
    assert r.type == "message" and r.role == "assistant" and r.model == SMOL_NAME
    assert r.id.startswith("msg_")
    assert r.stop_reason in ("end_turn", "max_tokens")
    assert r.content[0].type == "text" and r.content[0].text
    assert r.usage.output_tokens > 0

    with client.messages.stream(model=SMOL_NAME, max_tokens=16, extra_body=GREEDY,
                                messages=QUESTION, system="Answer briefly.") as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == r.content[0].text
    assert final.content[0].text == streamed
    assert final.stop_reason == r.stop_reason
    assert final.usage.output_tokens == r.usage.output_tokens

    n = client.messages.count_tokens(model=SMOL_NAME, messages=QUESTION,
                                     system="Answer briefly.")
    assert n.input_tokens == r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)
    # The system prompt is part of the count.
    other = client.messages.count_tokens(model=SMOL_NAME, messages=QUESTION,
                                         system="Answer briefly, in French, as a pirate would.")
    assert other.input_tokens > n.input_tokens

    # Structured output: `output_config.format` holds the answer to the schema.
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
              "required": ["city"], "additionalProperties": False}
    j = client.messages.create(model=SMOL_NAME, max_tokens=40, extra_body=GREEDY,
                               messages=QUESTION,
                               output_config={"format": {"type": "json_schema", "schema": schema}})
    assert j.stop_reason == "end_turn"
    value = json.loads(j.content[0].text)
    assert set(value) == {"city"} and len(value["city"]) <= 20

    cut = client.messages.create(model=SMOL_NAME, max_tokens=2, extra_body=GREEDY,
                                 messages=QUESTION)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2


def test_errors(client, base_url):
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="no-such-model", max_tokens=4, messages=QUESTION)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=base_url, api_key="wrong", max_retries=0).messages.create(
            model=SMOL_NAME, max_tokens=4, messages=QUESTION)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError, match="not supported"):
        client.messages.create(model=SMOL_NAME, max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}])


def check_weather(call):
    assert call.type == "tool_use" and call.name == "get_weather"
    assert call.id.startswith("toolu_")
    assert set(call.input) == {"city", "unit"}
    assert isinstance(call.input["city"], str) and len(call.input["city"]) <= 30
    assert call.input["unit"] in ("celsius", "fahrenheit")


def test_tool_use_round_trip(client):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.messages.create(model=QWEN_NAME, max_tokens=80, extra_body=GREEDY, tools=[WEATHER],
                               tool_choice={"type": "tool", "name": "get_weather"},
                               messages=ask)
    assert r.stop_reason == "tool_use"
    call = next(b for b in r.content if b.type == "tool_use")
    check_weather(call)

    # Streamed: the SDK accumulates the input_json_delta into the same input.
    with client.messages.stream(model=QWEN_NAME, max_tokens=80, extra_body=GREEDY, tools=[WEATHER],
                                tool_choice={"type": "tool", "name": "get_weather"},
                                messages=ask) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    streamed = next(b for b in final.content if b.type == "tool_use")
    check_weather(streamed)
    assert streamed.input == call.input

    follow = ask + [
        {"role": "assistant", "content": [call.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                      "content": "21 C, sunny"}]},
    ]
    r2 = client.messages.create(model=QWEN_NAME, max_tokens=40, extra_body=GREEDY,
                                tools=[WEATHER], messages=follow)
    assert r2.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert r2.content
    n = client.messages.count_tokens(model=QWEN_NAME, tools=[WEATHER], messages=follow)
    assert n.input_tokens == r2.usage.input_tokens + (r2.usage.cache_read_input_tokens or 0)
    # The tools are rendered into the prompt.
    bare = client.messages.count_tokens(model=QWEN_NAME, messages=follow)
    assert n.input_tokens > bare.input_tokens
