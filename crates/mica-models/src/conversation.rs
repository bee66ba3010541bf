//! The conversation a chat holds: an optional system prompt and the turns after it, rendered
//! whole with the model's chat template before every answer.
//!
//! Rendering the whole conversation each turn (rather than appending pieces by hand) keeps
//! the prompt exactly what the template would produce for the model, whatever its format;
//! the cost is avoided by the session's KV prefix reuse, which finds that the new prompt
//! starts with what is already cached and evaluates only the new suffix. When the
//! conversation no longer fits the context, the oldest turns are dropped (never the system
//! prompt), and the caller says so. A conversation saves to and loads from a small JSON
//! document (`mica chat`'s `/save` and `/load`), and reads OpenAI-style message lists.

use crate::chat::ChatMessage;
use crate::loader::{ChatPromptError, LoadedModel};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// Why a conversation could not be prepared, saved or read.
#[derive(Debug, thiserror::Error)]
pub enum ConversationError {
    #[error(transparent)]
    Prompt(#[from] ChatPromptError),
    /// Even the newest message alone does not fit.
    #[error(
        "this message needs {tokens} tokens with the conversation's system prompt and template, and the context holds {n_ctx} ({reserve} kept for the answer)"
    )]
    TooLong {
        tokens: usize,
        n_ctx: usize,
        reserve: usize,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not JSON: {source}", path.display())]
    NotJson {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{} is not a saved chat: {reason}", path.display())]
    NotAChat { path: PathBuf, reason: String },
    /// A JSON value that is not a conversation ([`Conversation::from_json`]).
    #[error("{0}")]
    Format(String),
}

type Result<T, E = ConversationError> = std::result::Result<T, E>;

/// The format tag written by `/save`.
const FORMAT: &str = "mica-chat/1";

/// A system prompt and the turns after it.
#[derive(Debug, Clone, Default)]
pub struct Conversation {
    /// The system prompt; empty for none.
    pub system: String,
    /// User and assistant messages in order (a user message may lack its answer while one
    /// is being generated).
    pub turns: Vec<ChatMessage>,
}

impl Conversation {
    /// Every message as the template sees it: the system prompt first when there is one.
    pub fn messages(&self) -> Vec<ChatMessage> {
        let mut out = Vec::with_capacity(self.turns.len() + 1);
        if !self.system.is_empty() {
            out.push(ChatMessage::new("system", self.system.clone()));
        }
        out.extend(self.turns.iter().cloned());
        out
    }

    /// The token ids of the whole conversation, ready for the assistant's next answer.
    pub fn prompt_ids(&self, lm: &LoadedModel) -> Result<Vec<u32>> {
        Ok(lm.chat_prompt(&self.messages())?)
    }

    /// Drops the oldest exchange (a user message and the answers after it) when there is
    /// one before the last user message; returns how many messages went.
    pub fn drop_oldest(&mut self) -> usize {
        let Some(last_user) = self.turns.iter().rposition(|m| m.role == "user") else {
            return 0;
        };
        if last_user == 0 {
            return 0;
        }
        // The first exchange ends where the next user message starts.
        let end = self.turns[1..]
            .iter()
            .position(|m| m.role == "user")
            .map_or(self.turns.len(), |i| i + 1);
        self.turns.drain(..end).count()
    }

    /// Makes the conversation fit `n_ctx` with `reserve` tokens left for the answer,
    /// dropping the oldest exchanges. Returns the prompt ids and how many messages were
    /// dropped; fails when even the last message alone does not fit.
    pub fn fit(
        &mut self,
        lm: &LoadedModel,
        n_ctx: usize,
        reserve: usize,
    ) -> Result<(Vec<u32>, usize)> {
        let mut dropped = 0;
        loop {
            let ids = self.prompt_ids(lm)?;
            if ids.len() + reserve <= n_ctx {
                return Ok((ids, dropped));
            }
            match self.drop_oldest() {
                0 => {
                    return Err(ConversationError::TooLong {
                        tokens: ids.len(),
                        n_ctx,
                        reserve,
                    });
                }
                n => dropped += n,
            }
        }
    }

    /// The conversation as the JSON `/save` writes.
    pub fn to_json(&self, model: &str) -> Value {
        json!({
            "format": FORMAT,
            "model": model,
            "system": self.system,
            "messages": self.turns.iter().map(|m| json!({"role": m.role, "content": m.content})).collect::<Vec<_>>(),
        })
    }

    /// Reads a conversation: what `/save` writes, or an OpenAI-style `{"messages": [...]}`
    /// or bare message list (a leading system message becomes the system prompt).
    pub fn from_json(value: &Value) -> Result<Conversation> {
        let bad = |msg: String| ConversationError::Format(msg);
        let (messages, system) = match value {
            Value::Array(list) => (list, None),
            Value::Object(obj) => {
                let messages = obj
                    .get("messages")
                    .and_then(Value::as_array)
                    .ok_or_else(|| bad("no \"messages\" list".into()))?;
                (messages, obj.get("system").and_then(Value::as_str))
            }
            _ => return Err(bad("expected a JSON object with \"messages\"".into())),
        };
        let mut conv = Conversation {
            system: system.unwrap_or_default().to_string(),
            turns: Vec::new(),
        };
        for (i, m) in messages.iter().enumerate() {
            let field = |k: &str| {
                m.get(k)
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("message {i} has no string \"{k}\"")))
            };
            let (role, content) = (field("role")?, field("content")?);
            match role {
                "system" if conv.turns.is_empty() => conv.system = content.to_string(),
                "user" | "assistant" => conv.turns.push(ChatMessage::new(role, content)),
                other => {
                    return Err(bad(format!(
                        "message {i} has role {other:?}; expected user or assistant"
                    )));
                }
            }
        }
        Ok(conv)
    }

    /// Writes [`Conversation::to_json`] to `path` (through a temporary file and a rename).
    pub fn save(&self, path: &Path, model: &str) -> Result<()> {
        // A `Value` always serializes.
        let text = serde_json::to_string_pretty(&self.to_json(model)).unwrap_or_default() + "\n";
        let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
        tmp_name.push(".tmp");
        let tmp = path.with_file_name(tmp_name);
        let write_err = |source| ConversationError::Write {
            path: path.to_path_buf(),
            source,
        };
        std::fs::write(&tmp, text).map_err(write_err)?;
        std::fs::rename(&tmp, path).map_err(write_err)
    }

    /// Reads what [`Conversation::save`] writes (or any JSON [`Conversation::from_json`]
    /// takes).
    pub fn load(path: &Path) -> Result<Conversation> {
        let text = std::fs::read_to_string(path).map_err(|source| ConversationError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let value: Value =
            serde_json::from_str(&text).map_err(|source| ConversationError::NotJson {
                path: path.to_path_buf(),
                source,
            })?;
        Conversation::from_json(&value).map_err(|e| ConversationError::NotAChat {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(roles: &[&str]) -> Conversation {
        Conversation {
            system: "sys".into(),
            turns: roles
                .iter()
                .enumerate()
                .map(|(i, r)| ChatMessage::new(*r, format!("m{i}")))
                .collect(),
        }
    }

    #[test]
    fn drops_whole_exchanges_and_keeps_the_last_message() {
        let mut c = conv(&["user", "assistant", "user", "assistant", "user"]);
        assert_eq!(c.drop_oldest(), 2);
        assert_eq!(c.turns[0].content, "m2");
        assert_eq!(c.drop_oldest(), 2);
        assert_eq!(c.turns.len(), 1);
        assert_eq!(c.drop_oldest(), 0);
        assert_eq!(c.system, "sys");
        assert_eq!(c.messages()[0].role, "system");
    }

    #[test]
    fn json_round_trip() {
        let c = conv(&["user", "assistant"]);
        let back = Conversation::from_json(&c.to_json("m")).unwrap();
        assert_eq!(back.system, "sys");
        assert_eq!(back.turns, c.turns);
        let openai = json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]});
        let o = Conversation::from_json(&openai).unwrap();
        assert_eq!((o.system.as_str(), o.turns.len()), ("s", 1));
        for bad in [
            json!(3),
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            json!([{"role": "user"}]),
        ] {
            assert!(Conversation::from_json(&bad).is_err(), "{bad}");
        }
    }
}
