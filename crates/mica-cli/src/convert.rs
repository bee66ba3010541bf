//! `mica convert`: flags into [`mica::quant::ConvertOptions`], the conversion itself by
//! [`mica::quant::convert`], and the summary it reports printed to stderr.

use crate::progress::Progress;
use anyhow::{Context, Result};
use clap::Args;
use mica::quant::{
    Calibration, ConvertOptions, ConvertReport, FileType, Imatrix, Importance, MixReport,
    TensorTypeRule,
};
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// Source: a GGUF file, a `.mica` file, or a Hugging Face folder (config.json,
    /// safetensors in F32/F16/BF16, tokenizer.json).
    pub src: PathBuf,
    /// Output file: `.mica` or `.gguf` (chosen by the extension).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Target type (f32, f16, bf16, q8_0, q6_k, q5_k, q4_k, q3_k, q2_k, q5_0, q5_1, q4_0,
    /// q4_1, the _s/_m/_l mixes, iq4_nl, iq4_xs, iq2_xs (needs --imatrix or --calibrate),
    /// tq1_0, tq2_0). Without it every tensor keeps its type.
    #[arg(long = "type", value_name = "TYPE")]
    pub ty: Option<String>,
    /// Mixed precision: choose a type per tensor for this average bits per weight (over
    /// every tensor of the file), least estimated loss first (see docs/convert.md). Best
    /// with --imatrix or --calibrate. Tensors the rules keep unquantized stay so.
    #[arg(long, value_name = "BPW")]
    pub mix: Option<f64>,
    /// Type of the tensors whose name matches REGEX (repeatable; the first match wins, as
    /// llama-quantize's --tensor-type): e.g. `--tensor-type 'attn_v=q8_0'`,
    /// `--tensor-type 'blk\.[0-3]\.ffn_down=q6_k'`. These tensors keep the given type
    /// under --mix too, and their bits count towards its budget.
    #[arg(long = "tensor-type", value_name = "REGEX=TYPE")]
    pub tensor_type: Vec<String>,
    /// Importance matrix (llama-imatrix's GGUF or legacy .dat file, or `mica imatrix`'s):
    /// weighs the quantizers' error by each column's mean squared activation.
    #[arg(long, value_name = "FILE", conflicts_with = "calibrate")]
    pub imatrix: Option<PathBuf>,
    /// Compute the importance matrix by running the source model over this text.
    #[arg(long, value_name = "TEXT")]
    pub calibrate: Option<PathBuf>,
    /// Error-compensating quantization (GPTQ) with the Gram matrices of the --calibrate
    /// text's activations: each block's rounding error is partly cancelled by the columns
    /// not yet quantized. Same file types; slower to convert (see docs/convert.md).
    #[arg(long, requires = "calibrate")]
    pub gptq: bool,
    /// Window size for --calibrate, in tokens.
    #[arg(long, default_value_t = 512, value_name = "N")]
    pub calibrate_ctx: usize,
    /// Use at most this many windows of the --calibrate text.
    #[arg(long, value_name = "N")]
    pub calibrate_chunks: Option<usize>,
    /// LoRA adapter merged into the weights before converting, at an optional scale
    /// (default 1): a PEFT folder or a GGUF LoRA file (repeatable; the updates add up). The
    /// merged tensors are quantized after merging, to their own type unless --type or
    /// --tensor-type say otherwise.
    #[arg(long = "lora", value_name = "PATH[:SCALE]")]
    pub lora: Vec<mica::models::LoraSpec>,
    /// Threads for quantization (default: all cores).
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The importance information the flags ask for (the matrix read, or the text).
fn importance(args: &ConvertArgs) -> Result<Importance> {
    if let Some(p) = &args.imatrix {
        let m = Imatrix::read(p)?;
        eprintln!(
            "importance matrix {}: {} matrices, {} windows",
            p.display(),
            m.entries.len(),
            m.chunk_count
        );
        return Ok(Importance::Matrix {
            imatrix: m,
            name: file_name(p),
        });
    }
    if let Some(p) = &args.calibrate {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        return Ok(Importance::Calibrate(Calibration {
            text,
            name: file_name(p),
            n_ctx: args.calibrate_ctx,
            max_windows: args.calibrate_chunks,
            gptq: args.gptq,
        }));
    }
    Ok(Importance::None)
}

pub fn convert(args: ConvertArgs) -> Result<()> {
    let file_type = match &args.ty {
        None => None,
        Some(t) => Some(
            FileType::parse(t)
                .with_context(|| format!("unknown type '{t}' (one of: {})", FileType::names()))?,
        ),
    };
    let tensor_types = args
        .tensor_type
        .iter()
        .map(|a| TensorTypeRule::parse(a))
        .collect::<Result<Vec<_>, _>>()?;
    let opts = ConvertOptions {
        file_type,
        mix: args.mix,
        tensor_types,
        importance: importance(&args)?,
        threads: args
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        lora: args.lora.clone(),
    };
    let mut progress = Progress::new(args.quiet);
    let report = mica::quant::convert(&args.src, &args.output, &opts, &mut |e| progress.handle(e))?;
    print_report(&args.output, &report);
    Ok(())
}

fn print_mix(m: &MixReport) {
    if let Some((n, secs)) = m.measured {
        eprintln!("mix: measured {n} tensors alone in {secs:.1} s");
    }
    if m.unmeasured > 0 {
        eprintln!(
            "mix: {} tensors could not be measured alone; they take the median sensitivity",
            m.unmeasured
        );
    }
    eprintln!(
        "mix: {:.4} bits per weight (budget {}), estimated loss {:.4e}",
        m.bpw,
        m.budget,
        m.total_loss()
    );
    for t in &m.tensors {
        eprintln!(
            "  {} = {} (estimated loss {:.3e})",
            t.name,
            t.ty.name(),
            t.loss
        );
    }
}

fn print_report(output: &Path, r: &ConvertReport) {
    if let Some(m) = &r.mix {
        print_mix(m);
    }
    if let Some(n) = r.gptq_tensors {
        eprintln!("GPTQ: {n} tensors error-compensated (the others rounded alone)");
    }
    let secs = r.seconds;
    eprintln!(
        "wrote {} ({:.1} MiB, {} tensors, {} converted, {:.4} bits per weight) in {:.2} s: \
         {:.1} MB/s of output, {:.1} MB/s of source",
        output.display(),
        r.bytes_written as f64 / (1 << 20) as f64,
        r.tensors,
        r.converted,
        r.bits_per_weight(),
        secs,
        r.bytes_written as f64 / 1e6 / secs,
        r.source_bytes as f64 / 1e6 / secs
    );
}
