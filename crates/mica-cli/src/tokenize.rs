//! `mica tokenize`: text to token ids, as llama.cpp's `llama-tokenize` prints them. Only the
//! tokenizer is loaded (no weights are read), so a vocabulary-only GGUF works too.

use anyhow::{Context, Result};
use clap::{ArgGroup, Args};
use mica::models::open_tokenizer;
use mica::models::tokenizer::DecodeOptions;
use std::io::{Read, Write};
use std::path::PathBuf;

#[derive(Args, Debug)]
#[command(group(ArgGroup::new("input").required(true).args(["prompt", "file", "stdin"])))]
pub struct TokenizeArgs {
    /// Model: a GGUF file (a vocabulary-only GGUF too), a .mica file, a Hugging Face folder
    /// (its tokenizer.json), or a store name (see `mica list`).
    #[arg(short = 'm', long = "model")]
    pub model: String,
    /// Text to tokenize, taken verbatim (no escape processing, unlike llama-tokenize).
    #[arg(short = 'p', long = "prompt", conflicts_with_all = ["file", "stdin"])]
    pub prompt: Option<String>,
    /// Read the text from a file.
    #[arg(short = 'f', long = "file", conflicts_with = "stdin")]
    pub file: Option<PathBuf>,
    /// Read the text from standard input.
    #[arg(long = "stdin")]
    pub stdin: bool,
    /// Print only the ids, as one list: [1, 2, 3].
    #[arg(long = "ids")]
    pub ids: bool,
    /// Add no BOS (nor other special tokens) even if the model normally does.
    #[arg(long = "no-bos")]
    pub no_bos: bool,
    /// Spell out special tokens written in the text (<|im_start|>...) instead of parsing
    /// them as special tokens.
    #[arg(long = "no-parse-special")]
    pub no_parse_special: bool,
    /// Print "Total number of tokens: N" on stdout (as llama-tokenize's --show-count)
    /// instead of stderr.
    #[arg(long = "show-count")]
    pub show_count: bool,
}

pub fn tokenize(args: TokenizeArgs) -> Result<()> {
    let path = crate::store::resolve_model(Some(&args.model), false)?;
    let tokenizer = open_tokenizer(&path)?;
    for warning in tokenizer.warnings() {
        eprintln!("warning: {warning}");
    }
    let text = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            String::from_utf8(bytes)
                .map_err(|e| anyhow::anyhow!("{}: not UTF-8 text ({e})", f.display()))?
        }
        (None, None) => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading standard input")?;
            s
        }
    };
    // As llama-tokenize: the model's special tokens (BOS...) unless --no-bos.
    let add_special = tokenizer.add_bos() && !args.no_bos;
    let ids = tokenizer.encode(&text, add_special, !args.no_parse_special)?;

    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.ids {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "[{}]", list.join(", "))?;
    } else {
        for &id in &ids {
            // Special tokens show as their text; a piece may be part of a character, written
            // as raw bytes as llama-tokenize does.
            let piece = tokenizer
                .token_piece(id, DecodeOptions::default())
                .unwrap_or_default();
            write!(out, "{id:6} -> '")?;
            out.write_all(piece)?;
            writeln!(out, "'")?;
        }
    }
    let count = format!("Total number of tokens: {}", ids.len());
    if args.show_count {
        writeln!(out, "{count}")?;
    }
    out.flush()?;
    if !args.show_count {
        eprintln!("{count}");
    }
    Ok(())
}
