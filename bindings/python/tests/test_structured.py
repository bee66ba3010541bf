"""Structured output and tool calls through ``Model.create_chat_completion``: every
constrained answer parses and validates; an invalid schema, regex or grammar raises
``InvalidParameter`` naming the argument and generates nothing; tool calls on
Qwen2.5-Coder (named and required ``tool_choice``, streamed and not) come back as
``tool_calls`` whose arguments validate, and a tool result continues the conversation."""

from __future__ import annotations

import json

import jsonschema
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

import mica
from conftest import THREADS, models_dir

QWEN = "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf"

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "languages": {"type": "array", "items": {"enum": ["en", "fr", "de"]},
                      "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                       "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def qwen() -> mica.Model:
    path = models_dir() / QWEN
    if not path.is_file():
        pytest.fail(f"{path} is missing: run scripts/fetch-test-models")
    return mica.Model(path, n_threads=THREADS, kv_mem=64 << 20)


def answer(model, **kw):
    kw.setdefault("max_tokens", 120)
    return model.create_chat_completion(
        [{"role": "user", "content": "Describe a person who speaks some languages."}],
        temperature=0, **kw)["choices"][0]


def test_json_schema_output_validates(model):
    c = answer(model, response_format={"type": "json_schema",
                                       "json_schema": {"name": "person", "schema": PERSON}})
    assert c["finish_reason"] == "stop", c
    jsonschema.validate(json.loads(c["message"]["content"]), PERSON)


def test_json_object_regex_and_choice(model):
    c = answer(model, response_format={"type": "json_object"})
    assert isinstance(json.loads(c["message"]["content"]), dict)
    c = answer(model, regex=r"[0-9]{3}-[a-z]{2}")
    assert c["finish_reason"] == "stop"
    import re
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", c["message"]["content"]), c
    c = answer(model, choice=["yes", "no", "maybe"])
    assert c["message"]["content"] in ("yes", "no", "maybe")
    gbnf = 'root ::= "A" [0-9] [0-9]'
    c = answer(model, grammar=gbnf)
    assert re.fullmatch(r"A[0-9][0-9]", c["message"]["content"]), c


def test_streamed_json_schema_output_validates(model):
    chunks = model.create_chat_completion(
        [{"role": "user", "content": "Describe a person."}], temperature=0, max_tokens=120,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}})
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("kw,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nosuch"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": 5}}},
     "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"regex": "a(b"}, "regex"),
    ({"grammar": 'root ::= "a" undefined_rule'}, "grammar"),
    ({"choice": []}, "choice"),
    ({"regex": "a", "choice": ["a"]}, "choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}],
      "tool_choice": "required"}, "tools"),
])
def test_invalid_constraints_fail_closed(model, kw, param):
    before = model.metrics()["requests"]
    with pytest.raises(mica.InvalidParameter) as e:
        model.create_chat_completion(ASK, max_tokens=8, **kw)
    assert e.value.param == param, (kw, str(e.value))
    assert model.metrics()["requests"] == before, "nothing was generated"


def check_call(call, tool=WEATHER):
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == tool["function"]["name"]
    args = json.loads(call["function"]["arguments"])
    jsonschema.validate(args, tool["function"]["parameters"])
    return args


def test_named_and_required_tool_calls(qwen):
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in (named, "required"):
        d = qwen.create_chat_completion(ASK, tools=[WEATHER, TIME], tool_choice=choice,
                                        temperature=0, max_tokens=80)
        ChatCompletion.model_validate(d)
        c = d["choices"][0]
        assert c["finish_reason"] == "tool_calls", c
        (call,) = c["message"]["tool_calls"]
        if choice == "required" and call["function"]["name"] == "get_time":
            check_call(call, TIME)
        else:
            assert check_call(call)["city"]
    # `none` hides the tools: a plain answer.
    c = qwen.create_chat_completion(ASK, tools=[WEATHER], tool_choice="none", temperature=0,
                                    max_tokens=16)["choices"][0]
    assert "tool_calls" not in c["message"] and c["finish_reason"] in ("stop", "length")


def test_streamed_tool_call_and_result_round_trip(qwen):
    chunks = list(qwen.create_chat_completion(
        ASK, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0, max_tokens=80, stream=True))
    for c in chunks:
        ChatCompletionChunk.model_validate(c)
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    calls = [tc for d in deltas for tc in d["delta"].get("tool_calls") or []]
    assert len(calls) == 1 and deltas[-1]["finish_reason"] == "tool_calls"
    args = check_call(calls[0])
    # The call and its result go back; the model answers in text.
    messages = ASK + [
        {"role": "assistant", "content": None,
         "tool_calls": [{k: v for k, v in calls[0].items() if k != "index"}]},
        {"role": "tool", "tool_call_id": calls[0]["id"], "name": "get_weather",
         "content": json.dumps({"city": args["city"], "temperature": 21, "unit": args["unit"]})},
    ]
    c = qwen.create_chat_completion(messages, tools=[WEATHER], temperature=0,
                                    max_tokens=40)["choices"][0]
    assert c["finish_reason"] in ("stop", "length")
    assert "21" in (c["message"]["content"] or ""), c

