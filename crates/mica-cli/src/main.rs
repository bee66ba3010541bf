//! `mica`: the command-line front end. Flags are parsed here into resolved settings; the
//! work happens in the library crates.

mod bench;
mod download;
mod inspect;
mod run;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "mica",
    version,
    about = "Local LLM inference: run GGUF models on the CPU",
    long_about = "Local LLM inference: run GGUF models on the CPU.\n\nWithout -m, `mica run` uses a small default model (SmolLM2-135M-Instruct), downloaded on first use."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streamed to stdout.
    Run(run::RunArgs),
    /// Describe a model file: architecture, sizes, tokenizer, tensors, chat template.
    Inspect(inspect::InspectArgs),
    /// Measure prompt-processing and generation speed (as llama.cpp's llama-bench).
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Inspect(args) => inspect::inspect(args),
        Command::Bench(args) => bench::bench(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
