//! Anthropic's Messages API over HTTP with the real model: whole answers and event streams
//! carry the same text as the OpenAI route for the same conversation, the system prompt and
//! tool results reach the chat template (counted as the OpenAI route renders them),
//! `stop_sequences` and `max_tokens` give their stop reasons, `count_tokens` counts the
//! prompt the answer used, errors take Anthropic's shape, and a forced tool call comes back
//! as a `tool_use` block whose input fits the schema, then a `tool_result` continues.

mod common;

use common::*;
use mica::engine::{Lane, SchedulerConfig};
use mica_server::ApiKey;
use serde_json::{Value, json};

const QUESTION: &str = "What is the capital of France?";

fn ask(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "max_tokens": 16,
        "temperature": 0,
        "messages": [{"role": "user", "content": QUESTION}],
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// The text blocks of an answer, joined.
fn text(m: &Value) -> String {
    m["content"]
        .as_array()
        .unwrap_or_else(|| panic!("no content: {m}"))
        .iter()
        .filter(|b| b["type"] == "text")
        .map(|b| b["text"].as_str().unwrap().to_string())
        .collect()
}

/// The events of an SSE body: `(event name, data)`, checking that each name is its data's
/// `type`.
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut name = None;
            let mut data = None;
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(serde_json::from_str::<Value>(d).unwrap());
                }
            }
            let (name, data) = (name.expect("event line"), data.expect("data line"));
            assert_eq!(data["type"], name.as_str(), "{e}");
            (name, data)
        })
        .collect()
}

fn prompt_tokens_openai(
    a: std::net::SocketAddr,
    model: &str,
    messages: Value,
    extra: Value,
) -> u64 {
    let mut body = json!({"model": model, "max_tokens": 1, "temperature": 0, "messages": messages});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let r = post(a, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["usage"]["prompt_tokens"].as_u64().unwrap()
}

fn count(a: std::net::SocketAddr, body: &Value) -> u64 {
    let r = post(a, "/v1/messages/count_tokens", body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["input_tokens"].as_u64().unwrap()
}

#[test]
fn messages_whole_streamed_and_counted() {
    let srv = start(config(SchedulerConfig::default(), vec![]));
    let a = srv.addr;

    // A whole answer: Anthropic's shape, the OpenAI route's text for the same conversation.
    let r = request(
        a,
        "POST",
        "/v1/messages",
        &[("anthropic-version", "2023-06-01")],
        &ask(json!({"metadata": {"user_id": "u1"}, "some_future_field": true})).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let m = r.json();
    assert!(m["id"].as_str().unwrap().starts_with("msg_"), "{m}");
    assert_eq!(m["type"], "message");
    assert_eq!(m["role"], "assistant");
    assert_eq!(m["model"], MODEL);
    assert_eq!(m["content"][0]["type"], "text");
    assert!(m["stop_sequence"].is_null());
    let answer = text(&m);
    assert!(!answer.is_empty());
    let o = post(
        a,
        "/v1/chat/completions",
        &json!({"model": MODEL, "max_tokens": 16, "temperature": 0,
                "messages": [{"role": "user", "content": QUESTION}]}),
    )
    .json();
    assert_eq!(
        answer,
        o["choices"][0]["message"]["content"].as_str().unwrap()
    );
    let expected_stop = match o["choices"][0]["finish_reason"].as_str().unwrap() {
        "length" => "max_tokens",
        _ => "end_turn",
    };
    assert_eq!(m["stop_reason"], expected_stop, "{m}");
    let u = &m["usage"];
    assert_eq!(u["output_tokens"], o["usage"]["completion_tokens"]);
    let prompt =
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(prompt, o["usage"]["prompt_tokens"].as_u64().unwrap());
    // count_tokens: the prompt the answer used.
    assert_eq!(count(a, &ask(json!({}))), prompt);

    // max_tokens cuts: stop_reason max_tokens.
    let m = post(a, "/v1/messages", &ask(json!({"max_tokens": 3}))).json();
    assert_eq!(m["stop_reason"], "max_tokens", "{m}");
    assert_eq!(m["usage"]["output_tokens"], 3);

    // Streamed: the events in order, the text deltas join into the same answer.
    let r = post(a, "/v1/messages", &ask(json!({"stream": true})));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let ev = events(&r.body);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[0], "message_start");
    assert_eq!(names[1], "content_block_start");
    assert_eq!(
        ev[1].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    let n = names.len();
    assert_eq!(
        names[n - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert!(names[2..n - 3].iter().all(|&e| e == "content_block_delta"));
    let start = &ev[0].1["message"];
    assert_eq!(start["role"], "assistant");
    assert_eq!(start["content"], json!([]));
    assert!(start["stop_reason"].is_null());
    assert_eq!(start["usage"]["input_tokens"].as_u64(), Some(prompt));
    let streamed: String = ev[2..n - 3]
        .iter()
        .map(|(_, d)| {
            assert_eq!(d["index"], 0);
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(streamed, answer);
    let delta = &ev[n - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], expected_stop);
    assert_eq!(delta["usage"]["output_tokens"], u["output_tokens"]);

    // The system prompt reaches the template: rendered as the OpenAI route's system turn.
    let system = "You are a pirate. Answer in one word.";
    for sys in [json!(system), json!([{"type": "text", "text": system}])] {
        let with_system = ask(json!({"system": sys}));
        assert_eq!(
            count(a, &with_system),
            prompt_tokens_openai(
                a,
                MODEL,
                json!([{"role": "system", "content": system}, {"role": "user", "content": QUESTION}]),
                json!({})
            )
        );
        // (SmolLM2's template puts a default system prompt in when none is given.)
        assert_ne!(count(a, &with_system), prompt);
    }
    let m = post(a, "/v1/messages", &ask(json!({"system": system}))).json();
    let o = post(
        a,
        "/v1/chat/completions",
        &json!({"model": MODEL, "max_tokens": 16, "temperature": 0, "messages":
            [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}]}),
    )
    .json();
    assert_eq!(
        text(&m),
        o["choices"][0]["message"]["content"].as_str().unwrap()
    );

    // stop_sequences: the answer ends before the first match, which is named.
    let words: Vec<&str> = answer.split_whitespace().collect();
    assert!(words.len() >= 3, "{answer}");
    let stop = words[2];
    let cut = &answer[..answer.find(stop).unwrap()];
    for stops in [json!([stop]), json!(["never-in-the-answer", stop])] {
        let m = post(a, "/v1/messages", &ask(json!({"stop_sequences": stops}))).json();
        assert_eq!(m["stop_reason"], "stop_sequence", "{m}");
        assert_eq!(m["stop_sequence"], stop, "{m}");
        assert_eq!(text(&m), cut);
        let ev = events(
            &post(
                a,
                "/v1/messages",
                &ask(json!({"stop_sequences": stops, "stream": true})),
            )
            .body,
        );
        let (_, delta) = ev.iter().find(|(n, _)| n == "message_delta").unwrap();
        assert_eq!(delta["delta"]["stop_reason"], "stop_sequence");
        assert_eq!(delta["delta"]["stop_sequence"], stop);
    }

    // Structured output: `output_config.format` holds the answer to the schema.
    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20}, "country": {"enum": ["France", "Spain"]}},
        "required": ["city", "country"], "additionalProperties": false});
    let m = post(
        a,
        "/v1/messages",
        &ask(json!({"max_tokens": 60, "output_config": {"format": {"type": "json_schema", "schema": schema}}})),
    )
    .json();
    assert_eq!(m["stop_reason"], "end_turn", "{m}");
    let v: Value = serde_json::from_str(&text(&m)).unwrap_or_else(|e| panic!("{e}: {m}"));
    assert!(v["city"].as_str().unwrap().chars().count() <= 20, "{v}");
    assert!(v["country"] == "France" || v["country"] == "Spain", "{v}");
    assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
}

#[test]
fn errors_have_anthropic_shape() {
    let key = "s3cret";
    let srv = start(config(
        SchedulerConfig::default(),
        vec![ApiKey {
            key: key.into(),
            lane: Lane::Interactive,
        }],
    ));
    let a = srv.addr;
    let call = |path: &str, headers: &[(&str, &str)], body: &Value| {
        request(a, "POST", path, headers, &body.to_string())
    };
    let keyed = [("x-api-key", key), ("anthropic-version", "2023-06-01")];
    let check = |r: &Resp, status: u16, kind: &str, needle: &str| {
        assert_eq!(r.status, status, "{}", r.body);
        let e = r.json();
        assert_eq!(e["type"], "error", "{e}");
        assert_eq!(e["error"]["type"], kind, "{e}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{needle}: {message}");
    };

    // The key: x-api-key (the anthropic SDK's header) or a bearer token; every route needs it.
    let r = call("/v1/messages", &[("x-api-key", "wrong")], &ask(json!({})));
    check(&r, 401, "authentication_error", "x-api-key");
    let r = call("/v1/messages/count_tokens", &[], &ask(json!({})));
    check(&r, 401, "authentication_error", "API key");
    let auth = format!("Bearer {key}");
    let r = call(
        "/v1/messages/count_tokens",
        &[("Authorization", &auth)],
        &ask(json!({})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = call("/v1/messages", &keyed, &ask(json!({"max_tokens": 2})));
    assert_eq!(r.status, 200, "{}", r.body);

    let mut no_max = ask(json!({}));
    no_max.as_object_mut().unwrap().remove("max_tokens");
    check(
        &call("/v1/messages", &keyed, &no_max),
        400,
        "invalid_request_error",
        "max_tokens",
    );
    check(
        &call(
            "/v1/messages",
            &keyed,
            &ask(json!({"messages": [{"role": "tool", "content": "x"}]})),
        ),
        400,
        "invalid_request_error",
        "messages[0].role",
    );
    check(
        &call(
            "/v1/messages",
            &keyed,
            &ask(json!({"messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]})),
        ),
        400,
        "invalid_request_error",
        "image blocks are not supported",
    );
    check(
        &call(
            "/v1/messages",
            &keyed,
            &ask(json!({"model": "no-such-model"})),
        ),
        404,
        "not_found_error",
        "no-such-model",
    );
    check(
        &call(
            "/v1/messages/count_tokens",
            &keyed,
            &ask(json!({"model": "no-such-model"})),
        ),
        404,
        "not_found_error",
        "no-such-model",
    );
    check(
        &request(a, "GET", "/v1/messages", &keyed, ""),
        405,
        "invalid_request_error",
        "GET",
    );
    // A schema that does not compile: a 400 before anything is generated (fail closed).
    check(
        &call(
            "/v1/messages",
            &keyed,
            &ask(json!({"output_config": {"format": {"type": "json_schema",
                "schema": {"type": "object", "properties": {"a": {"type": "strnig"}}}}}})),
        ),
        400,
        "invalid_request_error",
        "output_config.format",
    );
    check(
        &call(
            "/v1/messages",
            &keyed,
            &ask(json!({"tool_choice": {"type": "any"}})),
        ),
        400,
        "invalid_request_error",
        "tool_choice",
    );
    // The OpenAI routes keep their shape.
    let r = call(
        "/v1/chat/completions",
        &[("x-api-key", "wrong")],
        &json!({}),
    );
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
}

/// Qwen2.5-Coder: its chat template renders `tools` (SmolLM2's ignores them).
const QWEN: &str = "qwen2.5-coder-0.5b-instruct-awq-q4_k_m";

#[test]
fn tool_use_round_trip() {
    let path = model_path().with_file_name(format!("{QWEN}.gguf"));
    assert!(path.is_file(), "test model {} is missing", path.display());
    let mut cfg = config(SchedulerConfig::default(), vec![]);
    cfg.models = vec![(QWEN.to_string(), path)];
    let srv = start_with(cfg, Some(QWEN));
    let a = srv.addr;
    const MODEL: &str = QWEN;
    let tools = json!([
        {"name": "get_weather", "description": "Current weather in a city",
         "input_schema": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 30},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"]}},
        {"name": "get_time", "description": "Local time in a time zone",
         "input_schema": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 30}},
            "required": ["zone"]}}]);
    let question = "What is the weather in Paris?";
    let body = |extra: Value| {
        let mut b = json!({"model": MODEL, "max_tokens": 80, "temperature": 0, "tools": tools,
            "messages": [{"role": "user", "content": question}]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let valid = |input: &Value| {
        let city = input["city"].as_str().unwrap_or_else(|| panic!("{input}"));
        assert!(city.chars().count() <= 30, "{input}");
        assert!(
            ["celsius", "fahrenheit"].contains(&input["unit"].as_str().unwrap()),
            "{input}"
        );
        assert_eq!(input.as_object().unwrap().len(), 2, "{input}");
    };

    // tool_choice `tool` forces a call to that tool.
    let forced = body(json!({"tool_choice": {"type": "tool", "name": "get_weather"}}));
    let r = post(a, "/v1/messages", &forced);
    assert_eq!(r.status, 200, "{}", r.body);
    let m = r.json();
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    let call = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap_or_else(|| panic!("no tool_use: {m}"))
        .clone();
    let id = call["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("toolu_") && id.len() == 30, "{id}");
    assert_eq!(call["name"], "get_weather");
    valid(&call["input"]);

    // `any` forces a call to one of the tools.
    let m = post(
        a,
        "/v1/messages",
        &body(json!({"tool_choice": {"type": "any"}})),
    )
    .json();
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    let any = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap()
        .clone();
    assert!(
        any["name"] == "get_weather" || any["name"] == "get_time",
        "{m}"
    );

    // Streamed: a tool_use block whose input_json_delta holds the same input.
    let ev = events(
        &post(
            a,
            "/v1/messages",
            &body(json!({"tool_choice": {"type": "tool", "name": "get_weather"}, "stream": true})),
        )
        .body,
    );
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    let at = names
        .iter()
        .position(|&n| n == "content_block_start")
        .unwrap();
    let block = &ev[at].1;
    assert_eq!(block["content_block"]["type"], "tool_use", "{block}");
    assert_eq!(block["content_block"]["name"], "get_weather");
    assert_eq!(block["content_block"]["input"], json!({}));
    assert!(
        block["content_block"]["id"]
            .as_str()
            .unwrap()
            .starts_with("toolu_")
    );
    let json_text: String = ev
        .iter()
        .filter(|(n, d)| n == "content_block_delta" && d["index"] == block["index"])
        .map(|(_, d)| {
            assert_eq!(d["delta"]["type"], "input_json_delta");
            d["delta"]["partial_json"].as_str().unwrap().to_string()
        })
        .collect();
    let input: Value = serde_json::from_str(&json_text).unwrap();
    assert_eq!(input, call["input"]);
    let (_, delta) = ev.iter().find(|(n, _)| n == "message_delta").unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert_eq!(names.last(), Some(&"message_stop"));

    // The result goes back as a tool_result block; the conversation continues in text.
    let messages = json!([
        {"role": "user", "content": question},
        {"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "get_weather", "input": call["input"]}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id,
            "content": [{"type": "text", "text": "21 C, sunny"}]}]}]);
    let follow = json!({"model": MODEL, "max_tokens": 24, "temperature": 0, "tools": tools, "messages": messages});
    let r = post(a, "/v1/messages", &follow);
    assert_eq!(r.status, 200, "{}", r.body);
    let m = r.json();
    assert!(
        ["end_turn", "max_tokens", "tool_use"].contains(&m["stop_reason"].as_str().unwrap()),
        "{m}"
    );
    assert!(!m["content"].as_array().unwrap().is_empty(), "{m}");
    // The history is rendered as the OpenAI route renders the same turns.
    let openai_turns = json!([
        {"role": "user", "content": question},
        {"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
            "function": {"name": "get_weather", "arguments": call["input"].to_string()}}]},
        {"role": "tool", "tool_call_id": id, "name": "get_weather", "content": "21 C, sunny"}]);
    let openai_tools: Vec<Value> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {"name": t["name"],
            "description": t["description"], "parameters": t["input_schema"]}})
        })
        .collect();
    let expected = prompt_tokens_openai(a, MODEL, openai_turns, json!({"tools": openai_tools}));
    assert_eq!(count(a, &follow), expected);
    let u = &m["usage"];
    assert_eq!(
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap(),
        expected
    );
    // With tools shown the prompt is longer; `none` hides them, as on the OpenAI route.
    let bare = json!({"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": question}]});
    assert!(count(a, &body(json!({}))) > count(a, &bare));
    assert_eq!(
        count(a, &body(json!({"tool_choice": {"type": "none"}}))),
        count(a, &bare)
    );
}
