//! [`ToolStream`]: tool-call parsing over streamed text. Content is passed on as soon as
//! it cannot be part of a call; once a call starts (a `<tool_call>` tag, or output that
//! opens with `{` / `[` in the JSON formats) the rest is held and parsed at the end, so a
//! server streams plain answers token by token and sends calls whole.

use super::format::HERMES_OPEN;
use super::{ParsedOutput, ToolFormat, ToolSet};

/// Incremental splitting of output into content and calls (module docs).
#[derive(Debug)]
pub struct ToolStream {
    format: ToolFormat,
    /// Text received and not yet released.
    held: String,
    /// Everything received.
    all: String,
    /// A call has started: nothing more is released until the end.
    in_call: bool,
    /// Text was released already (JSON formats: only output that opens a call counts).
    released_any: bool,
    /// Bytes of `all` released so far (a prefix of it).
    released: usize,
}

/// What the start of an output (nothing released yet) says about a call.
enum Opening {
    /// Whitespace, or a prefix of a code fence: wait for more.
    Undecided,
    /// A JSON object or list, or a code fence: may be calls, held to the end.
    Call,
    Text,
}

fn opening(held: &str) -> Opening {
    let t = held.trim_start();
    if t.is_empty() || (t.len() < 3 && "```".starts_with(t)) {
        Opening::Undecided
    } else if t.starts_with('{') || t.starts_with('[') || t.starts_with("```") {
        Opening::Call
    } else {
        Opening::Text
    }
}

impl ToolStream {
    pub fn new(format: ToolFormat) -> ToolStream {
        ToolStream {
            format,
            held: String::new(),
            all: String::new(),
            in_call: false,
            released_any: false,
            released: 0,
        }
    }

    /// Adds generated text; returns the content that is safe to show now.
    pub fn push(&mut self, text: &str) -> String {
        self.all.push_str(text);
        if self.in_call {
            return String::new();
        }
        self.held.push_str(text);
        match self.format {
            ToolFormat::Hermes => {
                // Bare call objects (tags that were control tokens) or a fenced block
                // may open the output.
                if !self.released_any {
                    match opening(&self.held) {
                        Opening::Call => {
                            self.in_call = true;
                            return String::new();
                        }
                        Opening::Undecided => return String::new(),
                        Opening::Text => {}
                    }
                }
                if let Some(at) = self.held.find(HERMES_OPEN) {
                    self.in_call = true;
                    let out: String = self.held.drain(..at).collect();
                    return self.release(out);
                }
                // Hold the longest suffix that may begin the tag.
                let keep = (1..HERMES_OPEN.len().min(self.held.len() + 1))
                    .rev()
                    .find(|&n| {
                        self.held.is_char_boundary(self.held.len() - n)
                            && HERMES_OPEN.starts_with(&self.held[self.held.len() - n..])
                    })
                    .unwrap_or(0);
                let cut = self.held.len() - keep;
                let out: String = self.held.drain(..cut).collect();
                self.release(out)
            }
            ToolFormat::Llama3 | ToolFormat::Json => {
                if self.released_any {
                    let out = std::mem::take(&mut self.held);
                    return self.release(out);
                }
                match opening(&self.held) {
                    Opening::Undecided => String::new(),
                    Opening::Call => {
                        self.in_call = true;
                        String::new()
                    }
                    Opening::Text => {
                        let out = std::mem::take(&mut self.held);
                        self.release(out)
                    }
                }
            }
        }
    }

    fn release(&mut self, out: String) -> String {
        if !out.is_empty() {
            self.released_any = true;
            self.released += out.len();
        }
        out
    }

    /// Ends the stream: the content still held (to show after what [`push`](Self::push)
    /// returned) and the calls, validated by `tools`. When the held part turns out not to
    /// be valid calls it comes back as content.
    pub fn finish(self, tools: &ToolSet) -> ParsedOutput {
        if !self.in_call {
            return ParsedOutput {
                content: self.held,
                calls: Vec::new(),
            };
        }
        let parsed = tools.parse(&self.all);
        if parsed.calls.is_empty() {
            // Not calls: release everything not shown yet.
            return ParsedOutput {
                content: self.all[self.released..].to_string(),
                calls: Vec::new(),
            };
        }
        // Calls: the content before the first call was released already, so only text
        // after the calls (rare) remains; the parse trimmed content is not repeated.
        ParsedOutput {
            content: String::new(),
            calls: parsed.calls,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::Tool;
    use serde_json::json;

    fn set(format: ToolFormat) -> ToolSet {
        let t = Tool::from_openai(&json!({"function": {"name": "f",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}))
        .unwrap();
        ToolSet::new(vec![t], format).unwrap()
    }

    #[test]
    fn hermes_streams_content_then_holds_calls() {
        let tools = set(ToolFormat::Hermes);
        let mut s = tools.stream();
        let mut shown = String::new();
        for piece in [
            "Sure",
            ", <",
            "tool",
            "_call>\n{\"name\": \"f\", ",
            "\"arguments\": {\"x\": 1}}\n</tool_call>",
        ] {
            shown.push_str(&s.push(piece));
        }
        assert_eq!(shown, "Sure, ");
        let end = s.finish(&tools);
        assert_eq!(end.calls.len(), 1);
        assert_eq!(end.content, "");
    }

    #[test]
    fn held_prefix_is_released_when_no_call_follows() {
        let tools = set(ToolFormat::Hermes);
        let mut s = tools.stream();
        assert_eq!(s.push("a <tool"), "a ");
        assert_eq!(s.push("s> b"), "<tools> b");
        assert_eq!(s.push(" <to"), " ");
        let end = s.finish(&tools);
        assert_eq!((end.content.as_str(), end.calls.len()), ("<to", 0));
    }

    #[test]
    fn json_format_holds_output_that_opens_a_call() {
        let tools = set(ToolFormat::Json);
        let mut s = tools.stream();
        assert_eq!(s.push("  "), "");
        assert_eq!(s.push("{\"name\": \"f\", \"arguments\": {}}"), "");
        assert_eq!(s.finish(&tools).calls.len(), 1);

        let mut s = tools.stream();
        assert_eq!(s.push(" Hello"), " Hello");
        assert_eq!(s.push(" {x}"), " {x}");
        assert!(s.finish(&tools).calls.is_empty());

        // Shaped like a call but invalid arguments: released as content at the end.
        let mut s = tools.stream();
        assert_eq!(
            s.push("{\"name\": \"f\", \"arguments\": {\"x\": \"no\"}}"),
            ""
        );
        let end = s.finish(&tools);
        assert!(end.calls.is_empty());
        assert!(end.content.contains("\"no\""));

        // Held over several pieces, then not a call: all of it comes back.
        let mut s = tools.stream();
        assert_eq!(s.push("{\"name\": "), "");
        assert_eq!(s.push("\"zzz\"} and more"), "");
        assert_eq!(s.finish(&tools).content, "{\"name\": \"zzz\"} and more");
    }

    #[test]
    fn fenced_calls_are_held_and_parsed() {
        for format in [ToolFormat::Hermes, ToolFormat::Json] {
            let tools = set(format);
            let mut s = tools.stream();
            let mut shown = String::new();
            for piece in [
                "`",
                "``json\n{\"name\": \"f\", ",
                "\"arguments\": {\"x\": 2}}\n",
                "```",
            ] {
                shown.push_str(&s.push(piece));
            }
            assert_eq!(shown, "", "{format:?}");
            let end = s.finish(&tools);
            assert_eq!(end.calls.len(), 1, "{format:?}");
            assert_eq!(end.calls[0].arguments, json!({"x": 2}));
            // A fence holding code, not a call, is content.
            let mut s = tools.stream();
            assert_eq!(s.push("```py"), "");
            assert_eq!(s.push("\nprint(1)\n```"), "");
            assert_eq!(s.finish(&tools).content, "```py\nprint(1)\n```");
        }
    }
}
