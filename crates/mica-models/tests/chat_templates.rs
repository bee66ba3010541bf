//! Chat templates of the real test models against two references nobody here wrote:
//! llama.cpp's rendered prompts (`rendered_prompt` of the golden `chat` cases, via
//! `fixtures/tokenizer/<model>.json`) and Python Jinja2 configured as transformers configures
//! it (`fixtures/tokenizer/chat_reference.json`, from `gen_chat_reference.py`).
//!
//! Models are found in `$MICA_TEST_MODELS` (default `<workspace>/models`); a missing model
//! fails the test.

mod common;

use common::{GEMMA, QWEN, SMOLLM, load_tokenizer, tokenizer_fixture, workspace};
use mica_models::chat::{CHATML_TEMPLATE, ChatMessage, ChatTemplate, FunctionCall, ToolCall};
use serde_json::Value;

fn messages(v: &Value) -> Vec<ChatMessage> {
    v.as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            let mut msg =
                ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap());
            for call in m
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                msg.tool_calls.push(ToolCall {
                    id: None,
                    kind: call["type"].as_str().unwrap().to_string(),
                    function: FunctionCall {
                        name: call["function"]["name"].as_str().unwrap().to_string(),
                        arguments: call["function"]["arguments"].clone(),
                    },
                });
            }
            msg
        })
        .collect()
}

/// The golden `chat` case: rendered exactly as llama.cpp rendered it, and tokenized to its
/// prompt ids.
fn check_golden_chat(name: &str, expect_fallback: bool) {
    let tok = load_tokenizer(name);
    let template = ChatTemplate::for_tokenizer(&tok).unwrap();
    assert_eq!(template.is_fallback(), expect_fallback, "{name}");
    let fx = tokenizer_fixture(&format!("{name}.json"));
    let case = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "chat")
        .expect("chat case");
    let rendered = template.render(&messages(&case["messages"]), true).unwrap();
    assert_eq!(
        rendered,
        case["rendered_prompt"].as_str().unwrap(),
        "{name}"
    );
    let ids: Vec<u32> = case["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(tok.encode(&rendered, true, true).unwrap(), ids, "{name}");
}

#[test]
fn smollm2_chat_prompt_matches_llama_cpp() {
    check_golden_chat(SMOLLM, false);
}

#[test]
fn qwen25_chat_prompt_matches_llama_cpp() {
    check_golden_chat(QWEN, false);
}

/// Gemma 3's file has no template: llama.cpp falls back to ChatML, and so does mica, saying
/// so. The fallback source is llama.cpp's, byte for byte.
#[test]
fn gemma3_falls_back_to_llama_cpp_chatml() {
    check_golden_chat(GEMMA, true);
    let fx = tokenizer_fixture(&format!("{GEMMA}.json"));
    assert_eq!(CHATML_TEMPLATE, fx["chat_template"].as_str().unwrap());
}

/// More conversations (default system prompts, multi-turn, generation prompt on and off,
/// Qwen's tool-call branch) against Python Jinja2.
#[test]
fn templates_match_python_jinja2() {
    let reference = tokenizer_fixture("chat_reference.json");
    let renders = reference["renders"].as_array().unwrap();
    assert!(renders.len() >= 10);
    let mut checked = 0;
    for name in [SMOLLM, QWEN, GEMMA] {
        let tok = load_tokenizer(name);
        let template = ChatTemplate::for_tokenizer(&tok).unwrap();
        for r in renders.iter().filter(|r| r["model"] == name) {
            let got = template
                .render(
                    &messages(&r["messages"]),
                    r["add_generation_prompt"].as_bool().unwrap(),
                )
                .unwrap();
            assert_eq!(
                got,
                r["text"].as_str().unwrap(),
                "{name} {} {}",
                r["conversation"],
                r["add_generation_prompt"]
            );
            checked += 1;
        }
    }
    assert_eq!(checked, renders.len());
}

/// A template that prints BOS gets it removed when the tokenizer adds BOS itself, so the
/// prompt does not start with two (llama.cpp does the same after rendering).
#[test]
fn leading_bos_text_is_stripped_when_tokenizer_adds_bos() {
    let tok = load_tokenizer(GEMMA);
    assert!(tok.add_bos());
    let t = ChatTemplate::new("{{ bos_token }}{{ messages[0].content }}", "<bos>", "<eos>")
        .unwrap()
        .with_bos_eos_stripping(tok.add_bos(), tok.add_eos());
    let text = t.render(&[ChatMessage::new("user", "hi")], false).unwrap();
    assert_eq!(text, "hi");
    assert_eq!(
        tok.encode(&text, true, true).unwrap()[0],
        tok.bos().unwrap()
    );
}

/// Conversations with tools (the `tools` variable, an assistant turn that called a tool,
/// the tool's result with its call id) against Python Jinja2 configured as transformers
/// configures it (`fixtures/tokenizer/chat_tools_reference.json`, from
/// `gen_chat_tools_reference.py`): Qwen2.5's Hermes-style template and Llama 3.1's JSON one.
/// Tool definitions and arguments keep their key order, as Python's `json.dumps` prints
/// them. The date line of the Llama template is masked (the reference has no clock).
#[test]
fn templates_with_tools_match_python_jinja2() {
    let reference = tokenizer_fixture("chat_tools_reference.json");
    let renders = reference["renders"].as_array().unwrap();
    let mask = |s: &str| -> String {
        s.lines()
            .map(|l| {
                if l.starts_with("Today Date: ") {
                    "Today Date: X"
                } else {
                    l
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut checked = 0;
    for r in renders {
        let name = r["template"].as_str().unwrap();
        let template = if name.starts_with("llama31") {
            let path = workspace().join("fixtures/tokenizer/llama31-json-tools.jinja");
            ChatTemplate::new(
                &std::fs::read_to_string(path).unwrap(),
                "<|begin_of_text|>",
                "",
            )
            .unwrap()
        } else {
            ChatTemplate::for_tokenizer(&load_tokenizer(name)).unwrap()
        };
        let mut msgs = messages(&r["messages"]);
        for (m, v) in msgs.iter_mut().zip(r["messages"].as_array().unwrap()) {
            m.tool_call_id = v
                .get("tool_call_id")
                .and_then(Value::as_str)
                .map(str::to_string);
            m.name = v.get("name").and_then(Value::as_str).map(str::to_string);
            for (c, cv) in m
                .tool_calls
                .iter_mut()
                .zip(v["tool_calls"].as_array().into_iter().flatten())
            {
                c.id = cv.get("id").and_then(Value::as_str).map(str::to_string);
            }
        }
        let tools = r["tools"].as_array().unwrap();
        let got = template
            .render_with_tools(&msgs, Some(tools), true)
            .unwrap();
        assert_eq!(
            mask(&got),
            mask(r["text"].as_str().unwrap()),
            "{name} / {}",
            r["conversation"]
        );
        checked += 1;
    }
    assert_eq!(checked, 4);
}

/// SmolLM3's template against transformers' renderer (`fixtures/tokenizer/
/// smollm3_chat_reference.json`, from `gen_smollm3_chat_reference.py`): llama.cpp's copy,
/// and the same with the transformers-only `{% generation %}` markers SmolLM3-3B's own
/// template has, which render their body (llama.cpp's Jinja parser ignores them too).
#[test]
fn smollm3_template_matches_transformers() {
    let reference = tokenizer_fixture("smollm3_chat_reference.json");
    let mut checked = 0;
    for (name, source) in reference["templates"].as_object().unwrap() {
        let template = ChatTemplate::new(source.as_str().unwrap(), "", "<|im_end|>")
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for r in reference["renders"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["template"] == name.as_str())
        {
            let got = template
                .render(
                    &messages(&r["messages"]),
                    r["add_generation_prompt"].as_bool().unwrap(),
                )
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(
                got,
                r["text"].as_str().unwrap(),
                "{name} {} {}",
                r["conversation"],
                r["add_generation_prompt"]
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 16);
}

/// gpt-oss's harmony template (llama.cpp's copy, which its converter writes into gpt-oss
/// GGUF files) against transformers' renderer (`fixtures/tokenizer/gptoss_chat_reference.json`,
/// from `gen_gptoss_chat_reference.py`): a lone user turn, a system message with several
/// turns, a tool call and its result. The template prints today's date, masked on both
/// sides.
#[test]
fn gptoss_template_matches_transformers() {
    fn mask_date(s: &str) -> String {
        const KEY: &str = "Current date: ";
        match s.find(KEY) {
            Some(i) => {
                let at = i + KEY.len();
                format!("{}DATE{}", &s[..at], &s[at + "YYYY-MM-DD".len()..])
            }
            None => s.to_string(),
        }
    }
    let reference = tokenizer_fixture("gptoss_chat_reference.json");
    let source = reference["template"].as_str().unwrap();
    let template = ChatTemplate::new(source, "<|startoftext|>", "<|return|>").unwrap();
    let mut checked = 0;
    for r in reference["renders"].as_array().unwrap() {
        let got = template
            .render(
                &messages(&r["messages"]),
                r["add_generation_prompt"].as_bool().unwrap(),
            )
            .unwrap_or_else(|e| panic!("{}: {e}", r["conversation"]));
        let want = r["text"].as_str().unwrap();
        assert!(want.contains("Current date: "), "the reference has no date");
        assert_eq!(
            mask_date(&got),
            mask_date(want),
            "{} {}",
            r["conversation"],
            r["add_generation_prompt"]
        );
        checked += 1;
    }
    assert_eq!(checked, 6);
}
