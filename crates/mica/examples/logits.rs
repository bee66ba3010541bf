//! Prints raw logits through the facade: `logits MODEL IDS [--all]` writes, as little-endian
//! f32 to stdout, the logits after the comma-separated token `IDS` (`[n_vocab]`), or with
//! `--all` after every one of them (`[len(IDS), n_vocab]`, row-major). Custom samplers start
//! from these numbers; the Python package's tests use this program as the reference its
//! `Model.logits` must equal bit for bit.

use mica::{Model, SessionOptions};
use std::io::Write;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(path), Some(ids)) = (args.first(), args.get(1)) else {
        return Err("usage: logits MODEL IDS [--all]  (IDS: comma-separated token ids)".into());
    };
    let all = args.iter().skip(2).any(|a| a == "--all");
    let ids: Vec<u32> = ids
        .split(',')
        .map(|s| s.trim().parse::<u32>())
        .collect::<Result<_, _>>()?;
    let model = Model::open(path)?;
    let mut session = model.session(SessionOptions::default());
    let logits = if all {
        session.logits_all(&ids)?
    } else {
        session.logits(&ids)?
    };
    let mut out = std::io::stdout().lock();
    for x in logits {
        out.write_all(&x.to_le_bytes())?;
    }
    out.flush()?;
    Ok(())
}
