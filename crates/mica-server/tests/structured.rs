//! Structured output and tool calls over HTTP with the real model: OpenAI's
//! `response_format` and Ollama's `format` give output that parses and fits the schema, the
//! `regex` / `choice` / `grammar` extensions hold, every invalid constraint is a 400 naming
//! the field with nothing generated (fail closed), and forced tool calls come back as
//! `tool_calls` — whole answers, SSE deltas and Ollama's NDJSON.

mod common;

use common::*;
use mica::engine::SchedulerConfig;
use serde_json::{Value, json};

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Describe a person called Ada, aged 36, as JSON."}],
        "max_tokens": 120,
        "temperature": 0,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn person_schema() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2}},
        "required": ["name", "age", "tags"], "additionalProperties": false})
}

fn generated(a: std::net::SocketAddr) -> f64 {
    metric(a, "mica_generated_tokens_total", MODEL)
}

#[test]
fn constraints_hold_on_both_apis() {
    let srv = start(config(SchedulerConfig::default(), vec![]));
    let a = srv.addr;

    let r = post(
        a,
        "/v1/chat/completions",
        &chat(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "person", "strict": true, "schema": person_schema()}}})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let text = r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(v["name"].is_string() && v["age"].is_u64(), "{text}");
    let tags = v["tags"].as_array().unwrap();
    assert!((1..=2).contains(&tags.len()), "{text}");
    assert_eq!(r.json()["choices"][0]["finish_reason"], "stop");

    let r = post(
        a,
        "/v1/chat/completions",
        &chat(json!({"response_format": {"type": "json_object"}})),
    );
    let text = r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    // An unbounded object may be cut by max_tokens, which the finish reason says.
    if r.json()["choices"][0]["finish_reason"] == "stop" {
        assert!(serde_json::from_str::<Value>(&text).unwrap().is_object());
    } else {
        assert_eq!(r.json()["choices"][0]["finish_reason"], "length");
        assert!(text.starts_with('{'), "{text}");
    }

    // Streamed: the deltas join into the same constrained text.
    let body = chat(
        json!({"stream": true, "response_format": {"type": "json_schema",
        "json_schema": {"name": "person", "schema": person_schema()}}}),
    );
    let r = post(a, "/v1/chat/completions", &body);
    let joined: String = r
        .body
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(joined, text_of_schema_answer(a));

    let r = post(
        a,
        "/v1/chat/completions",
        &chat(json!({"choice": ["yes", "no"]})),
    );
    let c = r.json()["choices"][0]["message"]["content"].clone();
    assert!(c == "yes" || c == "no", "{c}");
    let r = post(
        a,
        "/v1/chat/completions",
        &chat(json!({"regex": "[0-9]{3}-[a-z]{2}"})),
    );
    let c = r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        c.len() == 6 && c.as_bytes()[3] == b'-' && c[..3].bytes().all(|b| b.is_ascii_digit()),
        "{c}"
    );
    let r = post(
        a,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "The answer is", "max_tokens": 10, "temperature": 0,
                "grammar": "root ::= \" \" (\"yes\" | \"no\") \".\""}),
    );
    let c = r.json()["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(c == " yes." || c == " no.", "{c}");

    // Ollama: `format` as a schema and as "json".
    let r = post(
        a,
        "/api/chat",
        &json!({"model": MODEL, "stream": false, "format": person_schema(),
                "messages": [{"role": "user", "content": "Describe Ada, 36, as JSON."}],
                "options": {"temperature": 0, "num_predict": 120}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let text = r.json()["message"]["content"].as_str().unwrap().to_string();
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(v["age"].is_u64(), "{text}");
    let r = post(
        a,
        "/api/generate",
        &json!({"model": MODEL, "stream": false, "format": "json", "prompt": "A JSON object:",
                "options": {"temperature": 0, "num_predict": 60}}),
    );
    let text = r.json()["response"].as_str().unwrap().to_string();
    if r.json()["done_reason"] == "stop" {
        assert!(
            serde_json::from_str::<Value>(&text).unwrap().is_object(),
            "{text}"
        );
    } else {
        assert_eq!(r.json()["done_reason"], "length");
        assert!(text.starts_with('{'), "{text}");
    }
}

/// The non-streaming answer of the schema request `constraints_hold_on_both_apis` streams.
fn text_of_schema_answer(a: std::net::SocketAddr) -> String {
    let r = post(
        a,
        "/v1/chat/completions",
        &chat(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "person", "schema": person_schema()}}})),
    );
    r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn invalid_constraints_fail_closed() {
    let srv = start(config(SchedulerConfig::default(), vec![]));
    let a = srv.addr;
    let before = generated(a);
    let weather = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "strnig"}}}})),
            "response_format",
            "strnig",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "strict": true,
                    "schema": {"type": "object", "dependentSchemas": {"a": {}}}}}})),
            "response_format",
            "dependentSchemas",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "schema": [1, 2]}}})),
            "response_format",
            "schema",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"grammar": "root ::= \"a\" | ("})),
            "grammar",
            "GBNF",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"grammar": "root ::= undefined-rule"})),
            "grammar",
            "undefined-rule",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"regex": "[a-"})),
            "regex",
            "regular expression",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"choice": []})),
            "choice",
            "at least one",
        ),
        (
            "/v1/chat/completions",
            chat(
                json!({"tools": weather, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            ),
            "tool_choice",
            "nope",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"tool_choice": "required"})),
            "tool_choice",
            "no tools",
        ),
        (
            "/v1/chat/completions",
            chat(
                json!({"tools": [{"type": "function", "function": {"name": "f",
                "parameters": {"type": 12}}}], "tool_choice": "required"}),
            ),
            "tools",
            "f",
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "x", "regex": "(unclosed"}),
            "regex",
            "regular expression",
        ),
        (
            "/api/chat",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                   "format": {"type": "object", "properties": {"a": {"type": "strnig"}}}}),
            "format",
            "strnig",
        ),
        (
            "/api/generate",
            json!({"model": MODEL, "prompt": "x", "format": "yaml"}),
            "format",
            "yaml",
        ),
        (
            "/api/generate",
            json!({"model": MODEL, "prompt": "x", "grammar": "root ::= [a-"}),
            "grammar",
            "GBNF",
        ),
    ];
    for (path, body, field, needle) in cases {
        let r = post(a, path, &body);
        assert_eq!(r.status, 400, "{path} {body}: {}", r.body);
        let e = r.json();
        let (message, param) = if path.starts_with("/v1") {
            (
                e["error"]["message"].as_str().unwrap_or("").to_string(),
                e["error"]["param"].as_str().unwrap_or("").to_string(),
            )
        } else {
            (
                e["error"].as_str().unwrap_or("").to_string(),
                field.to_string(),
            )
        };
        assert_eq!(param, field, "{body}: {}", r.body);
        assert!(message.contains(needle), "{body}: {message}");
        assert!(message.contains(field), "{body}: {message}");
    }
    assert_eq!(generated(a), before, "nothing was generated");
}

#[test]
fn forced_tool_calls_on_both_apis() {
    let srv = start(config(SchedulerConfig::default(), vec![]));
    let a = srv.addr;
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"]}}},
        {"type": "function", "function": {"name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 30}},
            "required": ["zone"]}}}]);
    let ask = |extra: Value| {
        let mut b = json!({"model": MODEL, "temperature": 0, "max_tokens": 80, "tools": tools,
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_time"}}),
    ] {
        let r = post(
            a,
            "/v1/chat/completions",
            &ask(json!({"tool_choice": choice})),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let ch = &r.json()["choices"][0];
        assert_eq!(ch["finish_reason"], "tool_calls", "{ch}");
        let call = &ch["message"]["tool_calls"][0];
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(call["type"], "function");
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        if choice.is_object() {
            assert_eq!(call["function"]["name"], "get_time");
            assert!(args["zone"].is_string(), "{args}");
        } else if call["function"]["name"] == "get_weather" {
            assert!(
                args["city"].is_string() && args["unit"].is_string(),
                "{args}"
            );
        }

        // Streaming: content-free deltas, one call delta, the finish reason.
        let r = post(
            a,
            "/v1/chat/completions",
            &ask(json!({"tool_choice": choice, "stream": true})),
        );
        let events: Vec<Value> = r
            .body
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|e| *e != "[DONE]")
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        let calls: Vec<&Value> = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"].get("tool_calls"))
            .collect();
        assert_eq!(calls.len(), 1, "{}", r.body);
        assert_eq!(
            calls[0][0]["function"]["name"],
            ch["message"]["tool_calls"][0]["function"]["name"]
        );
        assert_eq!(
            calls[0][0]["function"]["arguments"],
            ch["message"]["tool_calls"][0]["function"]["arguments"]
        );
        assert_eq!(
            events.last().unwrap()["choices"][0]["finish_reason"],
            "tool_calls"
        );
    }

    // A conversation with the call and its result renders and answers.
    let r = post(
        a,
        "/v1/chat/completions",
        &json!({"model": MODEL, "temperature": 0, "max_tokens": 10, "tools": tools,
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "21 C, sunny"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);

    // `none` shows the model no tools and forces nothing.
    let r = post(
        a,
        "/v1/chat/completions",
        &ask(json!({"tool_choice": "none"})),
    );
    assert!(
        r.json()["choices"][0]["message"]
            .get("tool_calls")
            .is_none()
    );

    // Ollama /api/chat with tools: a call parsed from the output when the model makes one.
    let r = post(
        a,
        "/api/chat",
        &json!({"model": MODEL, "stream": false, "tools": tools,
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "options": {"temperature": 0, "num_predict": 40}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let m = &r.json()["message"];
    assert!(m["content"].is_string(), "{m}");
    if let Some(calls) = m.get("tool_calls") {
        assert!(calls[0]["function"]["arguments"].is_object(), "{m}");
    }
}
