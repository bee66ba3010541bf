//! Reading what the user types: a line editor with history on a terminal (rustyline), plain
//! lines from a pipe or file otherwise, so `mica chat` can be scripted.
//!
//! A message may span lines: a line ending with `\` continues on the next, and text between
//! two `"""` markers is taken as it is, newlines included.

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;

use rustyline::error::ReadlineError;
use rustyline::{Config, DefaultEditor};

/// The primary and continuation prompts.
pub const PROMPT: &str = ">>> ";
pub const MORE: &str = "... ";

/// What one read gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    Text(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    /// Ctrl-D, or the end of piped input.
    Eof,
}

pub struct Input {
    /// The line editor when stdin is a terminal.
    editor: Option<DefaultEditor>,
    history: Option<PathBuf>,
    stdin: std::io::StdinLock<'static>,
}

impl Input {
    /// A line editor when stdin is a terminal (history loaded from `history`), plain line
    /// reading otherwise.
    pub fn new(history: Option<PathBuf>) -> Input {
        let editor = if std::io::stdin().is_terminal() {
            let config = Config::builder()
                .auto_add_history(false)
                .max_history_size(2000)
                .and_then(|b| b.history_ignore_dups(true))
                .map(|b| b.build())
                .unwrap_or_default();
            DefaultEditor::with_config(config).ok()
        } else {
            None
        };
        let mut input = Input {
            editor,
            history,
            stdin: std::io::stdin().lock(),
        };
        if let (Some(ed), Some(h)) = (&mut input.editor, &input.history) {
            // A missing history file is the normal first run.
            let _ = ed.load_history(h);
        }
        input
    }

    /// True when a person is typing (stdin is a terminal).
    pub fn interactive(&self) -> bool {
        self.editor.is_some()
    }

    /// One line, without its line ending.
    pub fn line(&mut self, prompt: &str) -> Read {
        match &mut self.editor {
            Some(ed) => match ed.readline(prompt) {
                Ok(line) => Read::Text(line),
                Err(ReadlineError::Interrupted) => Read::Interrupted,
                Err(ReadlineError::Eof) => Read::Eof,
                Err(e) => {
                    eprintln!("error: cannot read the terminal: {e}");
                    Read::Eof
                }
            },
            None => {
                let mut line = String::new();
                match self.stdin.read_line(&mut line) {
                    Ok(0) => Read::Eof,
                    Ok(_) => {
                        let trimmed = line.strip_suffix('\n').unwrap_or(&line);
                        Read::Text(trimmed.strip_suffix('\r').unwrap_or(trimmed).to_string())
                    }
                    Err(e) => {
                        eprintln!("error: cannot read stdin: {e}");
                        Read::Eof
                    }
                }
            }
        }
    }

    /// One message, joining continuation lines and `"""` blocks.
    pub fn message(&mut self) -> Read {
        let first = match self.line(PROMPT) {
            Read::Text(t) => t,
            other => return other,
        };
        if let Some(rest) = first.trim_start().strip_prefix("\"\"\"") {
            return self.block(rest.to_string());
        }
        let mut text = first;
        while text.ends_with('\\') {
            text.pop();
            text.push('\n');
            match self.line(MORE) {
                Read::Text(l) => text.push_str(&l),
                Read::Interrupted => return Read::Interrupted,
                Read::Eof => break,
            }
        }
        Read::Text(text)
    }

    /// The text of a `"""` block whose first line (after the marker) is `first`.
    fn block(&mut self, first: String) -> Read {
        let mut text = String::new();
        let mut line = first;
        loop {
            if let Some(end) = line.find("\"\"\"") {
                text.push_str(&line[..end]);
                break;
            }
            text.push_str(&line);
            text.push('\n');
            line = match self.line(MORE) {
                Read::Text(l) => l,
                Read::Interrupted => return Read::Interrupted,
                Read::Eof => break,
            };
        }
        let text = text.strip_prefix('\n').unwrap_or(&text);
        Read::Text(text.trim_end_matches('\n').to_string())
    }

    /// Adds a submitted message to the history and saves the history file.
    pub fn remember(&mut self, entry: &str) {
        if let Some(ed) = &mut self.editor {
            let _ = ed.add_history_entry(entry);
            if let Some(h) = &self.history {
                if let Some(dir) = h.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                let _ = ed.save_history(h);
            }
        }
    }

    pub fn history_file(&self) -> Option<&std::path::Path> {
        self.history.as_deref()
    }
}
