#!/usr/bin/env python3
"""Tool calls end to end through the real clients (run by tests/clients/run.sh against
`mica serve` with Qwen2.5-Coder): the `openai` SDK non-streaming and streaming (the SDK's
own stream accumulator) with tool_choice auto, required and a named function, a tool-result
round trip, and the `ollama` client's chat with tools. Every call's arguments must validate
against the function's parameter schema. Exits non-zero on the first failure.

usage: check_tools.py URL MODEL KEY
"""

import json

import jsonschema

from common import args, check, done, ollama_client, openai_client

url, model, key = args()


WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "description": "City name"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"]}
TIME = {"type": "object", "properties": {"timezone": {"type": "string"}},
        "required": ["timezone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather",
                                      "description": "Get the current weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time",
                                      "description": "Get the current time in a timezone",
                                      "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What's the weather like in Paris today?"}]


def valid_args(name, args):
    try:
        jsonschema.validate(args, SCHEMAS[name])
        return True
    except jsonschema.ValidationError:
        return False


def check_calls(label, calls, want=None):
    check(f"{label}: a tool call", bool(calls), calls)
    for c in calls:
        args = json.loads(c.function.arguments)
        check(f"{label}: {c.function.name} arguments validate", valid_args(c.function.name, args),
              args)
        check(f"{label}: call id", bool(c.id) and c.type == "function", c)
        if want:
            check(f"{label}: named function", c.function.name == want, c.function.name)


oa = openai_client(url, key)
for choice, want in [("auto", None), ("required", None),
                     ({"type": "function", "function": {"name": "get_time"}}, "get_time")]:
    label = f"openai tool_choice={choice if isinstance(choice, str) else 'named'}"
    r = oa.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice=choice,
                                   temperature=0, max_tokens=100)
    ch = r.choices[0]
    check(f"{label}: finish_reason tool_calls", ch.finish_reason == "tool_calls", ch)
    check_calls(label, ch.message.tool_calls, want)
    # Streaming, accumulated by the SDK's own helper.
    with oa.chat.completions.stream(model=model, messages=ASK, tools=TOOLS, tool_choice=choice,
                                    temperature=0, max_tokens=100) as s:
        final = s.get_final_completion()
    fc = final.choices[0]
    check(f"{label} stream: finish_reason", fc.finish_reason == "tool_calls", fc)
    check_calls(f"{label} stream", fc.message.tool_calls, want)
    check(f"{label} stream = non-stream",
          [(c.function.name, c.function.arguments) for c in fc.message.tool_calls]
          == [(c.function.name, c.function.arguments) for c in ch.message.tool_calls],
          (fc.message.tool_calls, ch.message.tool_calls))

# A round trip: the call and its result go back, the model answers in text (tool_choice
# none: a 0.5B model shown the tools again tends to call them again).
r = oa.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required",
                               temperature=0, max_tokens=100)
call = r.choices[0].message.tool_calls[0]
messages = ASK + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
    {"role": "tool", "tool_call_id": call.id, "content": "22 degrees celsius, sunny"},
]
r = oa.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice="none",
                               temperature=0, max_tokens=60)
answer = r.choices[0].message.content or ""
check("openai tool result round trip: a text answer",
      r.choices[0].finish_reason == "stop" and "22" in answer, r.choices[0])

# A question that needs no tool: `none` forbids calls.
r = oa.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="none",
                               temperature=0, max_tokens=30)
check("openai tool_choice=none: no calls", not r.choices[0].message.tool_calls, r.choices[0])

ol = ollama_client(url, key)
r = ol.chat(model=model, messages=ASK, tools=TOOLS, options={"temperature": 0, "num_predict": 100})
calls = r.message.tool_calls or []
check("ollama chat tools: a call", bool(calls), r.message)
for c in calls:
    check(f"ollama {c.function.name} arguments validate",
          valid_args(c.function.name, dict(c.function.arguments)), c.function.arguments)
stream_calls = []
for part in ol.chat(model=model, messages=ASK, tools=TOOLS, stream=True,
                    options={"temperature": 0, "num_predict": 100}):
    stream_calls += part.message.tool_calls or []
check("ollama chat tools stream = non-stream",
      [(c.function.name, dict(c.function.arguments)) for c in stream_calls]
      == [(c.function.name, dict(c.function.arguments)) for c in calls], stream_calls)
done()
