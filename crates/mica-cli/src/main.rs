//! `mica`: the command-line front end. Flags are parsed here into resolved settings; the
//! work happens in the library crates.

mod bench;
mod browse;
mod budget;
mod cache_args;
mod charts;
mod chat;
mod constraint_args;
mod convert;
mod embed;
mod gpu_args;
mod imatrix;
mod inspect;
mod logging;
mod lora_args;
mod perplexity;
mod progress;
mod run;
mod sampling_args;
mod serve;
mod spec_args;
mod store;
mod tokenize;
mod trace;
mod trace_chart;
mod verify;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "mica",
    version,
    about = "Local LLM inference: run GGUF models on the CPU",
    long_about = "Local LLM inference: run GGUF models on the CPU.\n\nModels live in a local store ($MICA_HOME/models, default under the user cache directory): `mica pull NAME` fetches one, `mica list` shows them, and every -m takes a store name or a file. Without -m, `mica run` uses a small default model (SmolLM2-135M-Instruct), downloaded on first use."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Write a Chrome trace-event JSON of the run to FILE (open it in Perfetto or
    /// chrome://tracing, or draw it with `mica trace-chart`): model loading, tokenizer,
    /// engine steps, forward passes by layer, every matrix product, compute-thread jobs.
    #[arg(long = "trace", value_name = "FILE", global = true)]
    trace: Option<std::path::PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streamed to stdout.
    Run(run::RunArgs),
    /// Chat with a model in the terminal (or with piped input).
    Chat(chat::ChatArgs),
    /// Embeddings of texts (pooled final hidden states), printed as JSON.
    Embed(embed::EmbedArgs),
    /// Fetch a model into the store: a catalog name, or hf:ORG/REPO[:FILE].
    Pull(store::PullArgs),
    /// List the models in the store (or, with --catalog, the ones `mica pull` knows).
    #[command(alias = "ls")]
    List(store::ListArgs),
    /// Remove models from the store.
    Rm(store::RmArgs),
    /// Browse the catalog and the store in the terminal: filter, search, download, delete,
    /// chat (a plain list when not on a terminal).
    Browse(browse::BrowseArgs),
    /// Describe a model file: architecture, sizes, tokenizer, tensors, chat template.
    Inspect(inspect::InspectArgs),
    /// Tokenize text with a model's tokenizer (as llama.cpp's llama-tokenize); loads only
    /// the vocabulary.
    Tokenize(tokenize::TokenizeArgs),
    /// Measure prompt-processing and generation speed (as llama.cpp's llama-bench).
    Bench(bench::BenchArgs),
    /// Serve models over HTTP (OpenAI-, Anthropic- and Ollama-compatible APIs, continuous
    /// batching).
    Serve(serve::ServeArgs),
    /// Convert a GGUF, .mica file or Hugging Face folder to .mica or GGUF, optionally
    /// quantizing it.
    Convert(convert::ConvertArgs),
    /// Compute an importance matrix over a text (as llama.cpp's llama-imatrix).
    Imatrix(imatrix::ImatrixArgs),
    /// Check every tensor of a .mica file against its checksum.
    Verify(verify::VerifyArgs),
    /// Perplexity of a model over a text file (as llama.cpp's llama-perplexity).
    Perplexity(perplexity::PerplexityArgs),
    /// Draw a flame chart (SVG) of a --trace file and print its spans by total time.
    TraceChart(trace_chart::TraceChartArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init();
    // The opt-in faster prompt path for the legacy formats (docs/numerics.md): a
    // process-wide switch of the kernels, which read no environment themselves.
    if std::env::var("MICA_PER_BLOCK").is_ok_and(|v| v == "1") {
        mica::kernels::simd::set_llama_exact(false);
    }
    let _trace = match cli.trace.as_deref().map(trace::start).transpose() {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Chat(args) => chat::chat(args),
        Command::Embed(args) => embed::embed(args),
        Command::Pull(args) => store::pull_cmd(args),
        Command::List(args) => store::list_cmd(args),
        Command::Rm(args) => store::rm_cmd(args),
        Command::Browse(args) => browse::browse_cmd(args),
        Command::Inspect(args) => inspect::inspect(args),
        Command::Tokenize(args) => tokenize::tokenize(args),
        Command::Bench(args) => bench::bench(args),
        Command::Serve(args) => serve::serve(args),
        Command::Convert(args) => convert::convert(args),
        Command::Imatrix(args) => imatrix::imatrix(args),
        Command::Verify(args) => verify::verify(args),
        Command::Perplexity(args) => perplexity::perplexity(args),
        Command::TraceChart(args) => trace_chart::trace_chart(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
