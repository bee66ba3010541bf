//! `mica convert`: GGUF or `.mica` in, `.mica` or GGUF out, optionally quantized.
//!
//! Tensors stream one at a time, in chunks of rows: each chunk is dequantized to f32 (when
//! its type changes), quantized with the reference quantizers of `mica-kernels` on every
//! core, and handed to the writer, so memory stays at a few chunks whatever the model size
//! (the source is memory-mapped; its pages are the kernel's to evict). The writer builds
//! the file under a temporary name and renames it only when complete.

mod gptq;
mod gptq_grid;
mod hf;
mod kl;
mod mix;
mod overrides;
mod rules;
mod source;

use crate::imatrix::Imatrix;
use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use mica_formats::ggml_types::GgmlType;
use mica_formats::gguf::TensorDecl;
use mica_formats::{GgufStreamWriter, MetaArray, MetaValue, MicaWriter, TensorInfo, TensorSink};
use mica_kernels::DType;
use mica_kernels::quant::weighted::{has_weighted, quantize_row_weighted};
use mica_kernels::quant::{dequantize_row, quantize_row};
use mica_models::weights::ActStats;
use rules::{FileType, ModelShape, TensorDesc};
use source::Source;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// Source: a GGUF file, a `.mica` file, or a Hugging Face folder (config.json,
    /// safetensors in F32/F16/BF16, tokenizer.json).
    pub src: PathBuf,
    /// Output file: `.mica` or `.gguf` (chosen by the extension).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Target type (f32, f16, bf16, q8_0, q6_k, q5_k, q4_k, q3_k, q2_k, q5_0, q5_1, q4_0,
    /// q4_1, and the _s/_m/_l mixes). Without it every tensor keeps its type.
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
    /// Threads for quantization (default: all cores).
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Elements per chunk (rows are grouped up to this many): 16 Mi f32 = 64 MiB.
const CHUNK_ELEMS: usize = 16 << 20;

/// The output container.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum OutFormat {
    Mica,
    Gguf,
}

/// Refuses what cannot (or must not) be read, with the reason.
fn check_source(src: &Path) -> Result<()> {
    let ext = src
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if matches!(
        ext.as_str(),
        "bin" | "pt" | "pth" | "ckpt" | "pkl" | "pickle"
    ) {
        bail!(
            "{}: PyTorch pickle checkpoints are not read: unpickling can execute arbitrary code \
             embedded in the file. Use the model's safetensors weights instead \
             (model.safetensors), which hold only tensors",
            src.display()
        );
    }
    if src.is_dir() && !src.join("config.json").is_file() {
        bail!(
            "{}: is a directory without config.json; give a .gguf or .mica file or a \
             Hugging Face model folder",
            src.display()
        );
    }
    Ok(())
}

fn out_format(out: &Path) -> Result<OutFormat> {
    match out
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .as_deref()
    {
        Some("mica") => Ok(OutFormat::Mica),
        Some("gguf") => Ok(OutFormat::Gguf),
        _ => bail!(
            "{}: the output must end in .mica or .gguf (that chooses the format)",
            out.display()
        ),
    }
}

/// The plan: each tensor's source and target type.
struct Planned<'a> {
    /// Index in the source's tensor list.
    idx: usize,
    info: &'a TensorInfo,
    target: GgmlType,
}

fn plan<'a>(src: &'a Source, ft: Option<FileType>) -> Result<Vec<Planned<'a>>> {
    let arch = src.get_str("general.architecture").unwrap_or("");
    let key = |k: &str| format!("{arch}.{k}");
    let n_head = src.get_u64(&key("attention.head_count")).unwrap_or(1);
    let n_head_kv = src
        .get_u64(&key("attention.head_count_kv"))
        .unwrap_or(n_head);
    let shape = ModelShape {
        n_layer: src.get_u64(&key("block_count")).unwrap_or(0) as usize,
        n_gqa: (n_head / n_head_kv.max(1)) as usize,
        tied_embeddings: !src.has_tensor("output.weight"),
    };
    let mut out = Vec::with_capacity(src.tensors().len());
    for (idx, t) in src.tensors().iter().enumerate() {
        let target = match ft {
            None => t.ggml_type,
            Some(ft) => {
                let desc = TensorDesc {
                    name: &t.name,
                    shape: &t.shape,
                };
                if !rules::allows_quantization(&desc) {
                    t.ggml_type
                } else {
                    let source = t.dtype().with_context(|| {
                        format!(
                            "tensor '{}' has type {}, which mica cannot convert",
                            t.name,
                            t.ggml_type.name()
                        )
                    })?;
                    GgmlType(rules::tensor_type(ft, &shape, &desc, source).ggml_id())
                }
            }
        };
        out.push(Planned {
            idx,
            info: t,
            target,
        });
    }
    Ok(out)
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The output metadata: the source's, with the file type updated.
fn out_metadata(src: &Source, ft: Option<FileType>, any_quant: bool) -> Vec<(String, MetaValue)> {
    let mut md: Vec<(String, MetaValue)> = src.metadata().to_vec();
    if ft.is_none()
        && let Source::Hf(_) = src
    {
        // A copy of a folder: the file type of its matrices (llama_ftype ids).
        let ty = src
            .tensors()
            .iter()
            .find(|t| t.shape.len() >= 2)
            .map(|t| t.ggml_type.0);
        let id = match ty.and_then(DType::from_ggml_id) {
            Some(DType::F16) => 1,
            Some(DType::BF16) => 32,
            _ => 0,
        };
        set_key(&mut md, "general.file_type", MetaValue::U32(id));
    }
    if let Some(ft) = ft {
        set_key(&mut md, "general.file_type", MetaValue::U32(ft.ftype_id()));
        if any_quant {
            set_key(&mut md, "general.quantization_version", MetaValue::U32(2));
        }
    }
    md
}

fn set_key(md: &mut Vec<(String, MetaValue)>, key: &str, v: MetaValue) {
    match md.iter_mut().find(|(k, _)| k == key) {
        Some(e) => e.1 = v,
        None => md.push((key.to_string(), v)),
    }
}

fn provenance(
    args: &ConvertArgs,
    src: &Source,
    ft: Option<FileType>,
    requantized: bool,
    planned: &[Planned],
    quantizer: &str,
) -> Vec<(String, MetaValue)> {
    let s = |v: &str| MetaValue::String(v.to_string());
    let mut p = vec![
        (
            "mica.converter".to_string(),
            s(&format!("mica {}", env!("CARGO_PKG_VERSION"))),
        ),
        ("mica.created_unix".into(), MetaValue::U64(now_unix())),
        (
            "mica.source.file".into(),
            s(&args
                .src
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()),
        ),
        ("mica.source.format".into(), s(src.format_name())),
        ("mica.source.bytes".into(), MetaValue::U64(src.size())),
        (
            "mica.recipe.type".into(),
            s(&match args.mix {
                Some(b) => format!("mix {b} bpw"),
                None => ft.map(FileType::name).unwrap_or("copy").to_string(),
            }),
        ),
        ("mica.recipe.quantizer".into(), s(quantizer)),
        (
            "mica.recipe.requantized".into(),
            MetaValue::Bool(requantized),
        ),
        (
            "mica.recipe.tensor_types".into(),
            MetaValue::Array(MetaArray::String(
                planned
                    .iter()
                    .map(|p| format!("{}={}", p.info.name, p.target.name()))
                    .collect(),
            )),
        ),
    ];
    if let Some(ft) = src.get_u64("general.file_type") {
        p.push(("mica.source.file_type".into(), MetaValue::U64(ft)));
    }
    p
}

pub fn convert(args: ConvertArgs) -> Result<()> {
    check_source(&args.src)?;
    let fmt = out_format(&args.output)?;
    let ft = match &args.ty {
        None => None,
        Some(t) => Some(
            FileType::parse(t)
                .with_context(|| format!("unknown type '{t}' (one of: {})", FileType::names()))?,
        ),
    };
    if let Some(b) = args.mix
        && !(1.0..=32.0).contains(&b)
    {
        bail!("--mix {b}: the budget is an average bits per weight, between 1 and 32");
    }
    // A mix starts from Q4_K_M's rules (which tensors are quantized at all).
    let ft = ft.or(args.mix.map(|_| FileType::Q4_K_M));
    if args.mix.is_some() && ft.is_some_and(|f| !is_quantized_ft(f)) {
        bail!("--mix chooses among quantized types; --type must be a quantized type");
    }
    if args.output.exists() && same_file(&args.src, &args.output) {
        bail!("the output would overwrite the source");
    }
    let overrides = overrides::parse(&args.tensor_type)?;
    let src = Source::open(&args.src)?;
    let mut planned = plan(&src, ft)?;
    let fixed = overrides::apply(&overrides, &mut planned)?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let (imatrix, quantizer, calibrated, grams) = importance(&args, ft, threads)?;
    let mut mix_note = None;
    if let Some(bpw) = args.mix {
        if imatrix.is_none() {
            eprintln!(
                "warning: --mix without --imatrix or --calibrate: sensitivities assume equal \
                 activations in every column"
            );
        }
        let mixable: Vec<usize> = planned
            .iter()
            .enumerate()
            .filter(|(i, p)| {
                is_quantized(p.target) && p.target != p.info.ggml_type && !fixed.contains(i)
            })
            .map(|(i, _)| i)
            .collect();
        // With calibration text, the estimated losses are put on one scale by measuring the
        // model's KL-divergence with each tensor quantized alone.
        let mut probe = match calibrated {
            Some((lm, text)) => {
                let p = kl::KlProbe::new(lm, &text, threads)?;
                Some(match &grams {
                    Some(g) => p.with_gptq(g.clone()),
                    None => p,
                })
            }
            None => {
                eprintln!(
                    "note: --mix without --calibrate compares tensors by their own output \
                     error; with --calibrate TEXT it measures each one's effect on the model's \
                     predictions (KL-divergence), which chooses better"
                );
                None
            }
        };
        let (got, losses) = mix::choose(
            &src,
            &mut planned,
            &mixable,
            imatrix.as_ref(),
            bpw,
            threads,
            probe.as_mut(),
            args.quiet,
        )?;
        drop(probe);
        let total: f64 = losses.iter().map(|l| l.1).sum();
        eprintln!("mix: {got:.4} bits per weight (budget {bpw}), estimated loss {total:.4e}");
        for (i, l) in losses {
            eprintln!(
                "  {} = {} (estimated loss {l:.3e})",
                planned[i].info.name,
                planned[i].target.name()
            );
        }
        mix_note = Some((bpw, got));
    }
    let requant: Vec<&Planned> = planned
        .iter()
        .filter(|p| p.target != p.info.ggml_type && is_quantized(p.info.ggml_type))
        .collect();
    if !requant.is_empty() {
        eprintln!(
            "warning: requantizing {} tensors that are already quantized (e.g. '{}' is {}): \
             errors compound; convert from an F32/F16/BF16 source for the best quality",
            requant.len(),
            requant[0].info.name,
            requant[0].info.ggml_type.name()
        );
    }
    let any_quant = planned.iter().any(|p| is_quantized(p.target));
    let mut md = out_metadata(&src, ft, any_quant);
    if let Some((bpw, got)) = mix_note {
        // GGUF has no provenance section: the recipe goes into the metadata (llama.cpp
        // ignores keys it does not know).
        md.push(("mica.recipe.mix_bpw".into(), MetaValue::F64(bpw)));
        md.push(("mica.recipe.bpw".into(), MetaValue::F64(got)));
        if fmt == OutFormat::Gguf {
            md.push((
                "mica.recipe.tensor_types".into(),
                MetaValue::Array(MetaArray::String(
                    planned
                        .iter()
                        .map(|p| format!("{}={}", p.info.name, p.target.name()))
                        .collect(),
                )),
            ));
        }
    }
    let mut sink: Box<dyn TensorSink> = match fmt {
        OutFormat::Mica => {
            let prov = provenance(&args, &src, ft, !requant.is_empty(), &planned, &quantizer);
            Box::new(MicaWriter::create(&args.output, &md, &prov)?)
        }
        OutFormat::Gguf => {
            let decls = planned
                .iter()
                .map(|p| TensorDecl {
                    name: p.info.name.clone(),
                    ggml_type: p.target,
                    shape: p.info.shape.clone(),
                })
                .collect();
            Box::new(GgufStreamWriter::create(&args.output, &md, decls)?)
        }
    };
    let total: u64 = planned
        .iter()
        .map(|p| p.target.n_bytes(&p.info.shape).unwrap_or(0))
        .sum();
    let bar = progress(total, args.quiet);
    let t0 = Instant::now();
    let mut done = 0u64;
    let mut n_gptq = 0usize;
    let mut factors = gptq::FactorCache::default();
    for p in &planned {
        bar.set_message(p.info.name.clone());
        sink.begin_tensor(&p.info.name, p.target, &p.info.shape)?;
        let imp = imatrix.as_ref().and_then(|m| m.weights(&p.info.name));
        let imp = imp.filter(|w| {
            let ok = w.len() as u64 == p.info.row_len();
            if !ok {
                eprintln!(
                    "warning: the importance matrix has {} columns for '{}', whose rows have {}; \
                     quantizing it unweighted",
                    w.len(),
                    p.info.name,
                    p.info.row_len()
                );
            }
            ok
        });
        let gram = grams.as_ref().and_then(|g| g.gram(&p.info.name));
        let mut on_bytes = |n| {
            done += n;
            bar.set_position(done);
        };
        match gram.filter(|_| gptq_applies(p)) {
            Some((g, n)) => {
                let f = factors
                    .factor(g, n, p.info.row_len() as usize)
                    .with_context(|| format!("tensor '{}' (GPTQ)", p.info.name))?;
                write_tensor_gptq(&src, p, &f, sink.as_mut(), threads, &mut on_bytes)?;
                n_gptq += 1;
            }
            None => write_tensor(
                &src,
                p,
                imp.as_deref(),
                sink.as_mut(),
                threads,
                &mut on_bytes,
            )?,
        }
        sink.end_tensor()?;
    }
    if args.gptq {
        eprintln!("GPTQ: {n_gptq} tensors error-compensated (the others rounded alone)");
    }
    let written = sink.bytes_written();
    sink.finish()?;
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let changed = planned
        .iter()
        .filter(|p| p.target != p.info.ggml_type)
        .count();
    let n_weights: u64 = planned.iter().map(|p| p.info.n_elements()).sum();
    eprintln!(
        "wrote {} ({:.1} MiB, {} tensors, {} converted, {:.4} bits per weight) in {:.2} s: \
         {:.1} MB/s of output, {:.1} MB/s of source",
        args.output.display(),
        written as f64 / (1 << 20) as f64,
        planned.len(),
        changed,
        total as f64 * 8.0 / n_weights.max(1) as f64,
        secs,
        written as f64 / 1e6 / secs,
        src.size() as f64 / 1e6 / secs
    );
    Ok(())
}

/// The importance matrix (read, or computed on the calibration text with the source model),
/// how the provenance describes the quantizer, and with `--calibrate` the loaded source model
/// and the text (for `--mix` to measure sensitivities with, without loading them again).
type Importance = (
    Option<Imatrix>,
    String,
    Option<(mica_models::LoadedModel, String)>,
    Option<Arc<ActStats>>,
);

fn importance(args: &ConvertArgs, ft: Option<FileType>, threads: usize) -> Result<Importance> {
    if ft.is_none() && (args.imatrix.is_some() || args.calibrate.is_some()) {
        bail!("--imatrix and --calibrate need a quantized --type");
    }
    if let Some(p) = &args.imatrix {
        let m = Imatrix::read(p)?;
        eprintln!(
            "importance matrix {}: {} matrices, {} windows",
            p.display(),
            m.entries.len(),
            m.chunk_count
        );
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
        return Ok((
            Some(m),
            format!("importance-weighted (imatrix {})", name.unwrap_or_default()),
            None,
            None,
        ));
    }
    if let Some(text_path) = &args.calibrate {
        let text = std::fs::read_to_string(text_path)
            .with_context(|| format!("reading {}", text_path.display()))?;
        let lm = mica_models::LoadedModel::open(&args.src)
            .context("--calibrate runs the source model, which failed to load")?;
        let name = text_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (m, grams) = crate::imatrix::collect_with(
            &lm,
            &text,
            &name,
            (args.calibrate_ctx, args.calibrate_chunks),
            threads,
            args.gptq,
            args.quiet,
        )?;
        let q = format!(
            "{} (calibrated on {name}: {} windows of {})",
            if args.gptq {
                "error-compensating (GPTQ), importance-weighted"
            } else {
                "importance-weighted"
            },
            m.chunk_count,
            m.chunk_size
        );
        return Ok((Some(m), q, Some((lm, text)), grams.map(Arc::new)));
    }
    Ok((None, "reference (no imatrix)".into(), None, None))
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

fn is_quantized_ft(f: FileType) -> bool {
    !matches!(f, FileType::F32 | FileType::F16 | FileType::BF16)
}

fn is_quantized(t: GgmlType) -> bool {
    !matches!(t.dtype(), Some(DType::F32 | DType::F16 | DType::BF16))
}

fn progress(total: u64, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// Streams one tensor into the sink: raw bytes when the type is unchanged, else chunks of
/// rows converted through f32.
fn write_tensor(
    src: &Source,
    p: &Planned,
    imp: Option<&[f32]>,
    sink: &mut dyn TensorSink,
    threads: usize,
    on_bytes: &mut dyn FnMut(u64),
) -> Result<()> {
    let data = src.data(p.idx)?;
    let data: &[u8] = &data;
    if p.target == p.info.ggml_type {
        for chunk in data.chunks(8 << 20) {
            sink.write_data(chunk)?;
            on_bytes(chunk.len() as u64);
        }
        return Ok(());
    }
    let (from, to, in_row, out_row) = row_types(p)?;
    let row_len = p.info.row_len() as usize;
    let n_rows = p.info.n_rows() as usize;
    let rows_per_chunk = (CHUNK_ELEMS / row_len.max(1)).max(1);
    let mut out = vec![0u8; rows_per_chunk.min(n_rows) * out_row];
    for r0 in (0..n_rows).step_by(rows_per_chunk) {
        let nr = rows_per_chunk.min(n_rows - r0);
        let src_bytes = &data[r0 * in_row..(r0 + nr) * in_row];
        let dst = &mut out[..nr * out_row];
        convert_rows(
            from,
            to,
            row_len,
            (in_row, out_row),
            src_bytes,
            dst,
            imp,
            threads,
        );
        sink.write_data(dst)?;
        on_bytes(dst.len() as u64);
    }
    Ok(())
}

/// The source and target types of `p` and their row sizes in bytes.
fn row_types(p: &Planned) -> Result<(DType, DType, usize, usize)> {
    let name = &p.info.name;
    let from = p
        .info
        .dtype()
        .with_context(|| format!("tensor '{name}': mica cannot read its type"))?;
    let to = p
        .target
        .dtype()
        .with_context(|| format!("tensor '{name}': mica cannot write its target type"))?;
    let row_len = p.info.row_len() as usize;
    let (Some(in_row), Some(out_row)) = (from.row_bytes(row_len), to.row_bytes(row_len)) else {
        bail!("tensor '{name}': row length {row_len} does not fit {from} or {to}");
    };
    Ok((from, to, in_row, out_row))
}

/// Whether GPTQ can quantize `p`: a quantized target whose blocks divide the rows.
fn gptq_applies(p: &Planned) -> bool {
    let cols = p.info.row_len() as usize;
    p.target != p.info.ggml_type
        && is_quantized(p.target)
        && p.target
            .dtype()
            .is_some_and(|t| cols.is_multiple_of(t.block_size()))
}

/// [`write_tensor`] with error compensation: the whole tensor in f32 (`rows × cols` floats),
/// quantized by [`gptq::quantize`] with the factor of its calibration inputs' Gram matrix.
fn write_tensor_gptq(
    src: &Source,
    p: &Planned,
    factor: &gptq::Factor,
    sink: &mut dyn TensorSink,
    threads: usize,
    on_bytes: &mut dyn FnMut(u64),
) -> Result<()> {
    let name = &p.info.name;
    let (from, to, _, _) = row_types(p)?;
    let data = src.data(p.idx)?;
    let out = gptq::requantize(from, &data, p.info.n_rows() as usize, factor, to, threads)
        .with_context(|| format!("tensor '{name}'"))?;
    sink.write_data(&out)?;
    on_bytes(out.len() as u64);
    Ok(())
}

/// Converts whole rows `src` (type `from`, `in_row` bytes each) into `dst` (type `to`,
/// `out_row` bytes each) on `threads` threads.
fn convert_rows(
    from: DType,
    to: DType,
    row_len: usize,
    (in_row, out_row): (usize, usize),
    src: &[u8],
    dst: &mut [u8],
    imp: Option<&[f32]>,
    threads: usize,
) {
    let imp = imp.filter(|_| has_weighted(to));
    let n_rows = dst.len() / out_row;
    let per = n_rows.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for (i, d) in dst.chunks_mut(per * out_row).enumerate() {
            let sr = &src[i * per * in_row..];
            s.spawn(move || {
                let mut f = vec![0f32; row_len];
                for (j, drow) in d.chunks_mut(out_row).enumerate() {
                    dequantize_row(from, &sr[j * in_row..(j + 1) * in_row], &mut f);
                    match imp {
                        Some(w) => quantize_row_weighted(to, &f, w, drow),
                        None => quantize_row(to, &f, drow),
                    }
                }
            });
        }
    });
}
