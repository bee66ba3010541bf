//! Chat templates: turning a conversation into the prompt text a model was trained on, by
//! rendering the Jinja template stored in GGUF `tokenizer.chat_template` with `minijinja`.
//!
//! The environment mirrors what Hugging Face `transformers` (`apply_chat_template`) and
//! llama.cpp (`common/chat.cpp`) give templates:
//! - `trim_blocks` and `lstrip_blocks` on, trailing newline dropped;
//! - variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, and `tools`
//!   (the OpenAI-style tool definitions, `{"type": "function", "function": {...}}`, or
//!   none);
//! - messages as `{role, content}`, plus `tool_calls` on an assistant turn that called
//!   tools and `tool_call_id` / `name` on a `tool` turn (a tool's result), as Qwen2.5's,
//!   Llama 3.x's and Hermes' templates read them;
//! - Python string/dict methods (`.strip()`, `.startswith()`, `.items()`...) through
//!   `minijinja_contrib::pycompat`;
//! - `raise_exception(msg)`, `strftime_now(fmt)` (UTC: a library has no business reading the
//!   local time zone), and a `tojson` that writes Python's `json.dumps` layout (`", "` and
//!   `": "` separators, non-ASCII kept) rather than minijinja's compact HTML-safe one;
//! - transformers' `{% generation %}` … `{% endgeneration %}` block (SmolLM3's template marks
//!   the assistant's text with it for training masks), which renders its body: it is
//!   compiled as `{% if true %}` … `{% endif %}`, a block tag with the same whitespace
//!   control (llama.cpp's Jinja parser skips these tags).
//!
//! As llama.cpp does after rendering, a leading BOS text is removed when the tokenizer will add
//! BOS itself (and a trailing EOS text when it adds EOS), so the prompt never starts with two.
//! A model without a template gets llama.cpp's ChatML fallback, and the caller is told.
//!
//! JSON objects (tool definitions, call arguments) keep their key order, so `tojson` prints
//! them as Python does. Not done: llama.cpp's polyfills for templates that lack a system
//! role or tool support.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, ErrorKind};
use serde::Serialize;

use crate::tokenizer::{DecodeOptions, Tokenizer};

/// llama.cpp's fallback template (`CHATML_TEMPLATE_SRC`) for models that ship none.
pub const CHATML_TEMPLATE: &str = "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\n' -}}\n{%- endif -%}";

const TEMPLATE_NAME: &str = "tokenizer.chat_template";

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    pub content: String,
    /// Calls the assistant made in this turn (absent from the template's view when empty).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// On a `tool` turn: the id of the call this is the result of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// On a `tool` turn: the function whose result this is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
}

/// An OpenAI-style function call: `{"type": "function", "function": {name, arguments}}`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ToolCall {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FunctionCall {
    pub name: String,
    /// Parsed JSON arguments (templates print them with `tojson`).
    pub arguments: serde_json::Value,
}

/// Why a call in a conversation's history could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolCallError {
    /// No `function.name`.
    #[error("a call needs function.name")]
    MissingName,
    /// `function.arguments` is a string that is not JSON.
    #[error("function.arguments is not JSON: {0}")]
    ArgumentsNotJson(String),
}

impl ToolCall {
    /// A call an assistant turn made, in OpenAI's shape (`{"id", "type": "function",
    /// "function": {"name", "arguments"}}`, or the function object alone as Ollama sends
    /// it); `arguments` a JSON string (OpenAI) or an object (Ollama), none an empty object.
    pub fn from_openai(v: &serde_json::Value) -> Result<ToolCall, ToolCallError> {
        use serde_json::Value as J;
        let f = v.get("function").unwrap_or(v);
        let name = f
            .get("name")
            .and_then(J::as_str)
            .ok_or(ToolCallError::MissingName)?;
        let arguments = match f.get("arguments") {
            None | Some(J::Null) => J::Object(Default::default()),
            Some(J::String(s)) => serde_json::from_str(s)
                .map_err(|e| ToolCallError::ArgumentsNotJson(e.to_string()))?,
            Some(v) => v.clone(),
        };
        Ok(ToolCall {
            id: v.get("id").and_then(J::as_str).map(str::to_string),
            kind: "function".into(),
            function: FunctionCall {
                name: name.to_string(),
                arguments,
            },
        })
    }
}

/// What can go wrong compiling or rendering a template.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    #[error("chat template syntax error{}: {message}", at_line(*line))]
    Syntax {
        line: Option<usize>,
        message: String,
    },
    #[error("chat template failed{}: {message}", at_line(*line))]
    Render {
        line: Option<usize>,
        message: String,
    },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" at line {l}")).unwrap_or_default()
}

impl ChatTemplateError {
    fn from_minijinja(err: &minijinja::Error, syntax: bool) -> ChatTemplateError {
        let message = match err.detail() {
            Some(detail) => format!("{}: {detail}", err.kind()),
            None => err.kind().to_string(),
        };
        let line = err.line();
        if syntax {
            ChatTemplateError::Syntax { line, message }
        } else {
            ChatTemplateError::Render { line, message }
        }
    }
}

/// A compiled chat template with the special-token texts it may print.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    strip_bos: bool,
    strip_eos: bool,
    fallback: bool,
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the texts templates see.
    pub fn new(
        source: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<ChatTemplate, ChatTemplateError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| ChatTemplateError::from_minijinja(&e, true))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, generation_blocks_as_if(source))
            .map_err(|e| ChatTemplateError::from_minijinja(&e, true))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            strip_bos: false,
            strip_eos: false,
            fallback: false,
        })
    }

    /// llama.cpp's ChatML fallback.
    pub fn chatml(bos_token: &str, eos_token: &str) -> ChatTemplate {
        let mut t = ChatTemplate::new(CHATML_TEMPLATE, bos_token, eos_token)
            .expect("the built-in ChatML template compiles");
        t.fallback = true;
        t
    }

    /// The template a model's tokenizer carries, or the ChatML fallback when it has none
    /// (check [`is_fallback`](Self::is_fallback) to tell the user). BOS/EOS texts and the
    /// stripping of a doubled BOS/EOS follow the tokenizer, as in llama.cpp.
    pub fn for_tokenizer(tokenizer: &Tokenizer) -> Result<ChatTemplate, ChatTemplateError> {
        let text = |id: Option<u32>| -> String {
            id.and_then(|id| tokenizer.token_piece(id, DecodeOptions::default()))
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default()
        };
        let (bos, eos) = (text(tokenizer.bos()), text(tokenizer.eos()));
        let template = match tokenizer.chat_template() {
            Some(source) => ChatTemplate::new(source, &bos, &eos)?,
            None => ChatTemplate::chatml(&bos, &eos),
        };
        Ok(template.with_bos_eos_stripping(tokenizer.add_bos(), tokenizer.add_eos()))
    }

    /// Remove a leading BOS text / trailing EOS text from rendered prompts, for a tokenizer
    /// that adds those tokens itself.
    pub fn with_bos_eos_stripping(mut self, strip_bos: bool, strip_eos: bool) -> ChatTemplate {
        self.strip_bos = strip_bos;
        self.strip_eos = strip_eos;
        self
    }

    /// Whether this is the ChatML fallback rather than the model's own template.
    pub fn is_fallback(&self) -> bool {
        self.fallback
    }

    /// Renders a conversation; `add_generation_prompt` appends the opening of the assistant's
    /// turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// [`ChatTemplate::render`] with tool definitions (OpenAI's `tools` list:
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`) in the
    /// template's `tools` variable; `None` (or an empty list) renders no tools.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let _span = tracing::trace_span!("chat_template", messages = messages.len()).entered();
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatTemplateError::from_minijinja(&e, true))?;
        let ctx = minijinja::context! {
            messages => messages.iter().map(message_value).collect::<Vec<Value>>(),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
            tools => match tools {
                Some(t) if !t.is_empty() => t.iter().map(json_value).collect::<Vec<Value>>().into(),
                _ => Value::from(()),
            },
        };
        let mut out = template
            .render(ctx)
            .map_err(|e| ChatTemplateError::from_minijinja(&e, false))?;
        if self.strip_bos && !self.bos_token.is_empty() && out.starts_with(&self.bos_token) {
            out.drain(..self.bos_token.len());
        }
        if self.strip_eos && !self.eos_token.is_empty() && out.ends_with(&self.eos_token) {
            out.truncate(out.len() - self.eos_token.len());
        }
        Ok(out)
    }
}

/// A message as templates see it: `role`, `content`, `tool_calls` when there are any, and
/// `tool_call_id` / `name` when set.
fn message_value(m: &ChatMessage) -> Value {
    let mut map = std::collections::BTreeMap::new();
    map.insert("role", Value::from(m.role.as_str()));
    map.insert("content", Value::from(m.content.as_str()));
    if !m.tool_calls.is_empty() {
        let calls = m.tool_calls.iter().map(|call| {
            let mut function = std::collections::BTreeMap::new();
            function.insert("name", Value::from(call.function.name.as_str()));
            function.insert("arguments", json_value(&call.function.arguments));
            let mut c = std::collections::BTreeMap::new();
            c.insert("type", Value::from(call.kind.as_str()));
            c.insert("function", Value::from(function));
            if let Some(id) = &call.id {
                c.insert("id", Value::from(id.as_str()));
            }
            Value::from(c)
        });
        map.insert("tool_calls", calls.collect::<Vec<Value>>().into());
    }
    if let Some(id) = &m.tool_call_id {
        map.insert("tool_call_id", Value::from(id.as_str()));
    }
    if let Some(name) = &m.name {
        map.insert("name", Value::from(name.as_str()));
    }
    Value::from(map)
}

/// JSON to a template value (objects keep their key order).
fn json_value(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(f)) => Value::from(f),
            (None, None) => Value::from(n.to_string()),
        },
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(a) => a.iter().map(json_value).collect::<Vec<Value>>().into(),
        serde_json::Value::Object(o) => {
            Value::from_pairs(o.iter().map(|(k, v)| (k.as_str(), json_value(v))))
        }
    }
}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("raise_exception: {message}"),
    ))
}

/// `tojson` as Python's `json.dumps(value, ensure_ascii=False, indent=indent)`.
fn tojson(value: &Value, indent: Option<usize>, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent = match kwargs.get::<Option<usize>>("indent")? {
        Some(i) => Some(i),
        None => indent,
    };
    // Accepted for compatibility; output is always non-ASCII-preserving and insertion-ordered
    // as far as minijinja keeps order.
    let _: Option<Value> = kwargs.get("ensure_ascii")?;
    let _: Option<Value> = kwargs.get("sort_keys")?;
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(value, indent, 0, &mut out)?;
    Ok(Value::from(out))
}

fn write_json(
    value: &Value,
    indent: Option<usize>,
    depth: usize,
    out: &mut String,
) -> Result<(), minijinja::Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(width) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', width * depth));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Some(i) = value.as_i64().filter(|_| value.is_integer()) {
                out.push_str(&i.to_string());
            } else {
                let f = f64::try_from(value.clone())?;
                if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 {
                    out.push_str(&format!("{f:.1}"));
                } else if f.is_finite() {
                    out.push_str(&f.to_string());
                } else {
                    out.push_str(if f.is_nan() {
                        "NaN"
                    } else if f > 0.0 {
                        "Infinity"
                    } else {
                        "-Infinity"
                    });
                }
            }
        }
        ValueKind::String => out.push_str(&json_string(value.as_str().unwrap_or_default())),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(item, indent, depth + 1, out)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let keys: Vec<Value> = value.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                let key_text = key.as_str().map_or_else(|| key.to_string(), str::to_string);
                out.push_str(&json_string(&key_text));
                out.push_str(": ");
                write_json(&value.get_item(key)?, indent, depth + 1, out)?;
            }
            newline(out, depth);
            out.push('}');
        }
        _ => out.push_str(&json_string(&value.to_string())),
    }
    Ok(())
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

/// `source` with each `{% generation %}` / `{% endgeneration %}` tag (transformers' block that
/// marks assistant text, rendering its body) as `{% if true %}` / `{% endif %}`, keeping the
/// tag's `-` / `+` whitespace modifiers, so the block renders as transformers renders it.
fn generation_blocks_as_if(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        let tag = &rest[open..];
        let Some(close) = tag.find("%}") else {
            break;
        };
        out.push_str(&rest[..open]);
        let inner = &tag[2..close];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[b.len()..]),
            None => (body, ""),
        };
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{lead} if true {trail}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{lead} endif {trail}%}}")),
            _ => out.push_str(&tag[..close + 2]),
        }
        rest = &tag[close + 2..];
    }
    out.push_str(rest);
    out
}

/// `strftime_now(format)`: the current UTC time, with the common `strftime` codes.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    strftime_utc(&format, secs)
}

/// Formats a Unix time (UTC). Supports `%Y %y %m %d %e %H %I %M %S %p %b %B %a %A %j %%`;
/// other codes are kept literally.
fn strftime_utc(format: &str, unix_secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('I') => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            Some('M') => out.push_str(&format!("{minute:02}")),
            Some('S') => out.push_str(&format!("{second:02}")),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(MONTHS[month as usize - 1]),
            Some('b') => out.push_str(&MONTHS[month as usize - 1][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('j') => out.push_str(&format!("{day_of_year:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// (year, month, day) → days since 1970-01-01.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = year - i64::from(month <= 2);
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_if_blocks() {
        let src = "a{% generation %}b{%- endgeneration -%} {%+ generation+%}{% if x %}{%endgeneration%}{{ '%}' }}{%";
        assert_eq!(
            generation_blocks_as_if(src),
            "a{% if true %}b{%- endif -%} {%+ if true +%}{% if x %}{% endif %}{{ '%}' }}{%"
        );
        let t = ChatTemplate::new(
            "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let text = t
            .render(&[ChatMessage::new("assistant", "hi")], false)
            .unwrap();
        assert_eq!(text, "[hi]");
    }

    #[test]
    fn strftime_known_dates() {
        // 2024-07-26 14:05:09 UTC, a Friday, day 208.
        let t = 1_722_002_709;
        assert_eq!(strftime_utc("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(
            strftime_utc("%A %B %e, %H:%M:%S %p %j %y%%", t),
            "Friday July 26, 14:05:09 PM 208 24%"
        );
        assert_eq!(strftime_utc("%Y-%m-%d", 0), "1970-01-01");
        assert_eq!(strftime_utc("%Y-%m-%d %a", 951_782_400), "2000-02-29 Tue");
        assert_eq!(days_from_civil(2000, 2, 29), 11_016);
    }

    #[test]
    fn tojson_is_python_style() {
        let t = ChatTemplate::new("{{ x | tojson }}|{{ x | tojson(indent=2) }}", "", "").unwrap();
        let env_out = t
            .env
            .get_template(TEMPLATE_NAME)
            .unwrap()
            .render(minijinja::context! { x => json_value(&serde_json::json!({"a": [1, 2.0, "é\n"], "b": null, "c": {}})) })
            .unwrap();
        assert_eq!(
            env_out,
            "{\"a\": [1, 2.0, \"é\\n\"], \"b\": null, \"c\": {}}|{\n  \"a\": [\n    1,\n    2.0,\n    \"é\\n\"\n  ],\n  \"b\": null,\n  \"c\": {}\n}"
        );
    }

    #[test]
    fn python_methods_raise_and_errors_carry_lines() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{{ m.content.strip() }}{% if m.role.startswith('u') %}!{% endif %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let msgs = [
            ChatMessage::new("user", "  hi  "),
            ChatMessage::new("assistant", " yo"),
        ];
        assert_eq!(t.render(&msgs, false).unwrap(), "hi!yo");

        let t =
            ChatTemplate::new("line one\n{{ raise_exception('no system role') }}", "", "").unwrap();
        let err = t.render(&msgs, false).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("line 2") && text.contains("no system role"),
            "{text}"
        );

        let err = ChatTemplate::new("ok\n{% if %}", "", "").unwrap_err();
        assert!(
            matches!(err, ChatTemplateError::Syntax { line: Some(2), .. }),
            "{err}"
        );
    }

    #[test]
    fn bos_stripping_and_fallback() {
        let t = ChatTemplate::new(
            "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
            "<s>",
            "</s>",
        )
        .unwrap();
        let msgs = [ChatMessage::new("user", "x")];
        assert_eq!(t.render(&msgs, false).unwrap(), "<s>x</s>");
        let t = t.with_bos_eos_stripping(true, true);
        assert_eq!(t.render(&msgs, false).unwrap(), "x");
        let chatml = ChatTemplate::chatml("", "");
        assert!(chatml.is_fallback());
        assert_eq!(
            chatml.render(&msgs, true).unwrap(),
            "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn history_calls_from_openai_and_ollama_shapes() {
        use serde_json::json;
        let openai = json!({"id": "call_1", "type": "function",
            "function": {"name": "f", "arguments": "{\"x\": 1}"}});
        let c = ToolCall::from_openai(&openai).unwrap();
        assert_eq!(c.id.as_deref(), Some("call_1"));
        assert_eq!(
            (c.function.name.as_str(), &c.function.arguments),
            ("f", &json!({"x": 1}))
        );
        let ollama = json!({"function": {"name": "g", "arguments": {"y": [2]}}});
        let c = ToolCall::from_openai(&ollama).unwrap();
        assert_eq!((c.id, c.function.arguments), (None, json!({"y": [2]})));
        let bare = json!({"name": "h"});
        assert_eq!(
            ToolCall::from_openai(&bare).unwrap().function.arguments,
            json!({})
        );
        assert_eq!(
            ToolCall::from_openai(&json!({"function": {"arguments": "{}"}})),
            Err(ToolCallError::MissingName)
        );
        assert!(matches!(
            ToolCall::from_openai(&json!({"function": {"name": "f", "arguments": "{x"}})),
            Err(ToolCallError::ArgumentsNotJson(_))
        ));
    }
}
