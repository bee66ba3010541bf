//! Conversion: GGUF, `.mica` or a Hugging Face folder in, `.mica` or GGUF out, optionally
//! quantized.
//!
//! Tensors stream one at a time, in chunks of rows: each chunk is dequantized to f32 (when
//! its type changes), quantized with the reference quantizers of `mica-kernels` on every
//! core, and handed to the writer, so memory stays at a few chunks whatever the model size
//! (the source is memory-mapped; its pages are the kernel's to evict). The writer builds
//! the file under a temporary name and renames it only when complete.
//!
//! The steps, in order: [`plan`] gives every tensor its type by llama.cpp's rules
//! ([`rules`]), [`overrides`] applies the user's per-tensor types, the importance
//! information is read or collected ([`Importance`]), [`mix`] chooses types for a
//! bits-per-weight budget, and [`write`] streams the tensors (with [`gptq`] for
//! error-compensated ones).

pub mod gptq;
pub mod gptq_grid;
pub mod hf;
pub mod kl;
pub mod lora;
pub mod mix;
pub mod overrides;
pub mod rules;
pub mod source;
mod write;

pub use mix::{MixReport, MixedTensor};

use crate::error::{QuantError, Result};
use crate::imatrix::{self, Imatrix};
use crate::progress::{Event, Notice, Task};
use mica_formats::ggml_types::GgmlType;
use mica_formats::gguf::TensorDecl;
use mica_formats::{GgufStreamWriter, MetaArray, MetaValue, MicaWriter, TensorInfo, TensorSink};
use mica_kernels::DType;
use mica_kernels::quant::can_quantize;
use mica_kernels::quant::weighted::requires_importance;
use mica_models::LoadedModel;
use mica_models::weights::ActStats;
use overrides::TensorTypeRule;
use rules::{FileType, ModelShape, TensorDesc};
use source::Source;
use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// What a conversion does besides copying.
#[derive(Clone, Debug, Default)]
pub struct ConvertOptions {
    /// Target file type: llama.cpp's per-tensor rules around a base type. `None`: every
    /// tensor keeps its type (unless `mix` or `tensor_types` say otherwise).
    pub file_type: Option<FileType>,
    /// Mixed precision: a type per tensor for this average bits per weight (1 to 32) over
    /// every tensor of the file, least estimated loss first. Starts from Q4_K_M's rules
    /// (which tensors are quantized at all) when `file_type` is `None`.
    pub mix: Option<f64>,
    /// Per-tensor types by name, the first matching rule winning (llama-quantize's
    /// `--tensor-type`); these tensors keep their type under `mix` too.
    pub tensor_types: Vec<TensorTypeRule>,
    /// What the quantizers weigh their error by.
    pub importance: Importance,
    /// Threads for quantization (0 counts as 1).
    pub threads: usize,
    /// LoRA adapters merged into the weights before conversion ([`lora`]); the merged
    /// tensors keep their stored type unless the options give them another.
    pub lora: Vec<mica_models::lora::LoraSpec>,
}

/// The importance information of a conversion.
#[derive(Clone, Debug, Default)]
pub enum Importance {
    /// None: the reference quantizers.
    #[default]
    None,
    /// An importance matrix read beforehand ([`Imatrix::read`]); `name` is how the
    /// provenance names it (its file name).
    Matrix { imatrix: Imatrix, name: String },
    /// Computed on calibration text by running the source model.
    Calibrate(Calibration),
}

/// Calibration text for [`Importance::Calibrate`].
#[derive(Clone, Debug)]
pub struct Calibration {
    pub text: String,
    /// How the provenance and the importance matrix name the text (its file name).
    pub name: String,
    /// Window size in tokens.
    pub n_ctx: usize,
    /// Use at most this many windows of the text.
    pub max_windows: Option<usize>,
    /// Error-compensating quantization (GPTQ) with the Gram matrices of the text's
    /// activations.
    pub gptq: bool,
}

/// What a conversion did (for the caller to report).
#[derive(Clone, Debug)]
pub struct ConvertReport {
    /// Tensors written, and how many of them changed type.
    pub tensors: usize,
    pub converted: usize,
    /// Bytes of the output file, and of its tensor data alone.
    pub bytes_written: u64,
    pub tensor_bytes: u64,
    /// Weights (elements) of every tensor.
    pub weights: u64,
    /// Bytes of the source (all shards for a folder).
    pub source_bytes: u64,
    /// Seconds spent writing the tensors.
    pub seconds: f64,
    /// With GPTQ: the tensors quantized with error compensation (the others rounded alone).
    pub gptq_tensors: Option<usize>,
    /// With `mix`: the types chosen.
    pub mix: Option<MixReport>,
}

impl ConvertReport {
    /// Average bits per weight of the written tensors.
    pub fn bits_per_weight(&self) -> f64 {
        self.tensor_bytes as f64 * 8.0 / self.weights.max(1) as f64
    }
}

/// Elements per chunk (rows are grouped up to this many): 16 Mi f32 = 64 MiB.
const CHUNK_ELEMS: usize = 16 << 20;

/// The output container.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum OutFormat {
    Mica,
    Gguf,
}

/// Refuses what cannot be read, with the reason (a checkpoint file on its own has no
/// config: its folder is the source).
fn check_source(src: &Path) -> Result<()> {
    let ext = src
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if matches!(
        ext.as_str(),
        "bin" | "pt" | "pth" | "ckpt" | "pkl" | "pickle"
    ) {
        return Err(QuantError::PickleSource { path: src.into() });
    }
    if src.is_dir() && !src.join("config.json").is_file() {
        return Err(QuantError::NotAModelFolder { path: src.into() });
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
        _ => Err(QuantError::OutputExtension { path: out.into() }),
    }
}

/// The plan: each tensor's source and target type.
pub(crate) struct Planned<'a> {
    /// Index in the source's tensor list.
    pub idx: usize,
    pub info: &'a TensorInfo,
    pub target: GgmlType,
}

fn plan<'a>(src: &'a Source, ft: Option<FileType>, has_imatrix: bool) -> Result<Vec<Planned<'a>>> {
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
        has_imatrix,
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
                    let source = t.dtype().ok_or_else(|| QuantError::UnconvertibleType {
                        tensor: t.name.clone(),
                        ggml_type: t.ggml_type.name(),
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
    if ft.is_none() && src.is_hf() {
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

/// The `.mica` provenance section: converter, source, and recipe.
fn provenance(
    src_path: &Path,
    src: &Source,
    (ft, mix): (Option<FileType>, Option<f64>),
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
            s(&src_path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()),
        ),
        ("mica.source.format".into(), s(src.format_name())),
        ("mica.source.bytes".into(), MetaValue::U64(src.size())),
        (
            "mica.recipe.type".into(),
            s(&match mix {
                Some(b) => format!("mix {b} bpw"),
                None => ft.map(FileType::name).unwrap_or("copy").to_string(),
            }),
        ),
        ("mica.recipe.quantizer".into(), s(quantizer)),
        (
            "mica.recipe.requantized".into(),
            MetaValue::Bool(requantized),
        ),
        ("mica.recipe.tensor_types".into(), tensor_types(planned)),
    ];
    if let Some(ft) = src.get_u64("general.file_type") {
        p.push(("mica.source.file_type".into(), MetaValue::U64(ft)));
    }
    p
}

/// `name=TYPE` of every planned tensor.
fn tensor_types(planned: &[Planned]) -> MetaValue {
    MetaValue::Array(MetaArray::String(
        planned
            .iter()
            .map(|p| format!("{}={}", p.info.name, p.target.name()))
            .collect(),
    ))
}

/// Converts the model at `src_path` (GGUF, `.mica`, or a Hugging Face folder) into
/// `output` (`.mica` or `.gguf`, chosen by the extension) as `opts` say. Progress,
/// warnings and notes go to `on_event`.
pub fn convert(
    src_path: &Path,
    output: &Path,
    opts: &ConvertOptions,
    on_event: &mut dyn FnMut(Event),
) -> Result<ConvertReport> {
    check_source(src_path)?;
    let fmt = out_format(output)?;
    if let Some(b) = opts.mix
        && !(1.0..=32.0).contains(&b)
    {
        return Err(QuantError::MixBudget { bpw: b });
    }
    // A mix starts from Q4_K_M's rules (which tensors are quantized at all).
    let ft = opts.file_type.or(opts.mix.map(|_| FileType::Q4_K_M));
    if opts.mix.is_some() && ft.is_some_and(|f| !f.is_quantized()) {
        return Err(QuantError::MixNeedsQuantizedType);
    }
    if output.exists() && same_file(src_path, output) {
        return Err(QuantError::OverwritesSource);
    }
    let mut src = Source::open(src_path, on_event)?;
    let merged = lora::merge(&mut src, src_path, &opts.lora)?;
    let src = src;
    let has_imatrix = !matches!(opts.importance, Importance::None);
    let mut planned = plan(&src, ft, has_imatrix)?;
    let fixed = overrides::apply(&opts.tensor_types, &mut planned)?;
    if ft.is_none() {
        // Quantized after merging: back to the type the tensor had.
        for &(i, ty) in merged.iter().filter(|(i, _)| !fixed.contains(i)) {
            planned[i].target = ty;
        }
    }
    let threads = opts.threads.max(1);
    let prepared = prepare_importance(src_path, opts, ft, threads, on_event)?;
    let imatrix = prepared.imatrix.as_deref();
    let mut mix_report = None;
    if let Some(bpw) = opts.mix {
        if imatrix.is_none() {
            on_event(Event::Notice(Notice::MixUnweighted));
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
        let mut probe = match prepared.calibrated {
            Some((lm, text)) => {
                let p = kl::KlProbe::new(lm, text, threads, on_event)?;
                Some(match &prepared.grams {
                    Some(g) => p.with_gptq(g.clone()),
                    None => p,
                })
            }
            None => {
                on_event(Event::Notice(Notice::MixUncalibrated));
                None
            }
        };
        mix_report = Some(mix::choose(
            &src,
            &mut planned,
            &mixable,
            imatrix,
            bpw,
            threads,
            probe.as_mut(),
            on_event,
        )?);
    }
    check_writable(&planned, imatrix)?;
    let requant: Vec<&Planned> = planned
        .iter()
        .filter(|p| p.target != p.info.ggml_type && is_quantized(p.info.ggml_type))
        .collect();
    if let Some(first) = requant.first() {
        on_event(Event::Notice(Notice::Requantizing {
            tensors: requant.len(),
            example: first.info.name.clone(),
            example_type: first.info.ggml_type.name(),
        }));
    }
    let any_quant = planned.iter().any(|p| is_quantized(p.target));
    let mut md = out_metadata(&src, ft, any_quant);
    if let Some(m) = &mix_report {
        // GGUF has no provenance section: the recipe goes into the metadata (llama.cpp
        // ignores keys it does not know).
        md.push(("mica.recipe.mix_bpw".into(), MetaValue::F64(m.budget)));
        md.push(("mica.recipe.bpw".into(), MetaValue::F64(m.bpw)));
        if fmt == OutFormat::Gguf {
            md.push(("mica.recipe.tensor_types".into(), tensor_types(&planned)));
        }
    }
    let mut sink: Box<dyn TensorSink> = match fmt {
        OutFormat::Mica => {
            let prov = provenance(
                src_path,
                &src,
                (ft, opts.mix),
                !requant.is_empty(),
                &planned,
                &prepared.quantizer,
            );
            Box::new(MicaWriter::create(output, &md, &prov)?)
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
            Box::new(GgufStreamWriter::create(output, &md, decls)?)
        }
    };
    let tensor_bytes: u64 = planned
        .iter()
        .map(|p| p.target.n_bytes(&p.info.shape).unwrap_or(0))
        .sum();
    let t0 = Instant::now();
    let writer = write::Writer {
        src: &src,
        imatrix,
        grams: prepared.grams.as_deref(),
        threads,
    };
    on_event(Event::Start {
        task: Task::Write,
        total: tensor_bytes,
    });
    let n_gptq = writer.write_all(&planned, sink.as_mut(), on_event)?;
    let bytes_written = sink.bytes_written();
    sink.finish()?;
    on_event(Event::Finish);
    Ok(ConvertReport {
        tensors: planned.len(),
        converted: planned
            .iter()
            .filter(|p| p.target != p.info.ggml_type)
            .count(),
        bytes_written,
        tensor_bytes,
        weights: planned.iter().map(|p| p.info.n_elements()).sum(),
        source_bytes: src.size(),
        seconds: t0.elapsed().as_secs_f64(),
        gptq_tensors: matches!(&opts.importance, Importance::Calibrate(c) if c.gptq)
            .then_some(n_gptq),
        mix: mix_report,
    })
}

/// The importance information, ready: the matrix (given, or computed on the calibration
/// text with the source model), how the provenance describes the quantizer, and with
/// calibration text the loaded source model and the text (for `mix` to measure
/// sensitivities with, without loading them again) and, for GPTQ, the Gram matrices.
struct Prepared<'o> {
    imatrix: Option<Cow<'o, Imatrix>>,
    quantizer: String,
    calibrated: Option<(LoadedModel, &'o str)>,
    grams: Option<Arc<ActStats>>,
}

fn prepare_importance<'o>(
    src_path: &Path,
    opts: &'o ConvertOptions,
    ft: Option<FileType>,
    threads: usize,
    on_event: &mut dyn FnMut(Event),
) -> Result<Prepared<'o>> {
    if ft.is_none() && !matches!(opts.importance, Importance::None) {
        return Err(QuantError::ImportanceNeedsQuantizedType);
    }
    match &opts.importance {
        Importance::None => Ok(Prepared {
            imatrix: None,
            quantizer: "reference (no imatrix)".into(),
            calibrated: None,
            grams: None,
        }),
        Importance::Matrix { imatrix, name } => Ok(Prepared {
            imatrix: Some(Cow::Borrowed(imatrix)),
            quantizer: format!("importance-weighted (imatrix {name})"),
            calibrated: None,
            grams: None,
        }),
        Importance::Calibrate(c) => {
            let lm = LoadedModel::open(src_path)
                .map_err(|cause| QuantError::CalibrationModel { cause })?;
            let windows = imatrix::Windows {
                n_ctx: c.n_ctx,
                max: c.max_windows,
            };
            let (m, grams) =
                imatrix::collect_with(&lm, &c.text, &c.name, windows, threads, c.gptq, on_event)?;
            let quantizer = format!(
                "{} (calibrated on {}: {} windows of {})",
                if c.gptq {
                    "error-compensating (GPTQ), importance-weighted"
                } else {
                    "importance-weighted"
                },
                c.name,
                m.chunk_count,
                m.chunk_size
            );
            Ok(Prepared {
                imatrix: Some(Cow::Owned(m)),
                quantizer,
                calibrated: Some((lm, &c.text)),
                grams: grams.map(Arc::new),
            })
        }
    }
}

/// Refuses, before anything is written, a target type mica has no quantizer for (the grid
/// i-quants but IQ2_XS) and an IQ2_XS target without importance for its tensor (llama.cpp
/// refuses those too: its quantizer asserts an importance matrix).
fn check_writable(planned: &[Planned], imatrix: Option<&Imatrix>) -> Result<()> {
    for p in planned.iter().filter(|p| p.target != p.info.ggml_type) {
        let Some(ty) = p.target.dtype() else {
            continue;
        };
        let tensor = || p.info.name.clone();
        if requires_importance(ty) {
            let Some(m) = imatrix else {
                return Err(QuantError::ImportanceRequired {
                    tensor: tensor(),
                    ty,
                });
            };
            let row_len = p.info.row_len();
            if m.weights(&p.info.name)
                .is_none_or(|w| w.len() as u64 != row_len)
            {
                return Err(QuantError::ImportanceMissing {
                    tensor: tensor(),
                    ty,
                    row_len,
                });
            }
        } else if !can_quantize(ty) {
            return Err(QuantError::UnwritableGridType {
                tensor: tensor(),
                ty,
            });
        }
    }
    Ok(())
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

fn is_quantized(t: GgmlType) -> bool {
    !matches!(t.dtype(), Some(DType::F32 | DType::F16 | DType::BF16))
}
