//! LoRA adapters: low-rank updates `W' = W + s·B·A` of a model's projections, read from a
//! PEFT folder (`adapter_config.json` + `adapter_model.safetensors`) or from llama.cpp's GGUF
//! LoRA files (`general.type = adapter`), and either applied beside the base weights
//! (unmerged: each targeted projection adds `s·B·(A·x)` to its output, the base weights stay
//! shared and untouched) or merged into them.
//!
//! The scale `s` is PEFT's: `lora_alpha / r` (`lora_alpha / √r` with rsLoRA), times the
//! user's scale; llama.cpp's GGUF files carry `adapter.lora.alpha` and the rank is read from
//! the tensors. Adapter matrices stored in f16 stay f16 (their products convert the
//! activations to f16, as ggml's do); f32 and bf16 ones are held in f32.
//!
//! Unmerged, `A x` is a matrix product through the kernels (`A`'s rows are long), and
//! `B (A x)` a sum of `B`'s columns scaled by `A x`'s `r` values ([`LowRankB`]: `B` held
//! transposed, streamed once per call); both are split across the thread pool once the
//! product is large enough (`SPLIT_WORK`).
//!
//! Not supported, refused naming what: PEFT biases (`bias` other than `none`),
//! `fan_in_fan_out`, DoRA (`use_dora`), `modules_to_save`, targets that are not a separate
//! projection in mica (fused projections, embeddings, experts).

use crate::arch::to_gguf::permute_heads;
use crate::arch::{by_gguf, by_hf};
use crate::error::{ModelError, Result};
use crate::model::Model;
use crate::weights::{Linear, Matrix};
use half::f16;
use mica_formats::{GgufFile, SafetensorsFile, TensorInfo};
use mica_kernels::lowrank::LowRankB;
use mica_kernels::matmul::{QActs, matmul_min_work};
use mica_kernels::{DType, ThreadPool, quant};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

mod select;
pub use select::LoraSelection;
pub(crate) use select::RowAdapters;

/// The low-rank update of one projection: `out += scale · B (A x)`.
pub struct LoraPair {
    /// `[r × in]`, f32 or f16
    pub a: Matrix,
    /// `[out × r]`, f32 or f16, held transposed for the product ([`LowRankB`]).
    pub b: LowRankB,
    /// The adapter's scale (`alpha / r`, or `alpha / √r` with rsLoRA) times the user's.
    pub scale: f32,
}

thread_local! {
    /// The calling thread's buffers for [`LoraPair::add`] (quantized inputs, `A x`, `B A x`),
    /// kept between calls: every projection of every forward pass goes through it.
    static SCRATCH: std::cell::RefCell<(QActs, Vec<f32>, Vec<f32>)> =
        std::cell::RefCell::new((QActs::new(), Vec::new(), Vec::new()));
}

/// Multiply-adds from which an adapter's product is split across the thread pool. Lower
/// than the base products' threshold: an adapter's matrices are streamed from memory once
/// per call, so a second thread's bandwidth pays for waking it sooner.
const SPLIT_WORK: usize = 32 * 1024;

impl LoraPair {
    /// `out[t] += scale · B (A x[t])` for `n` rows of `x` (`[n, in]`); `out` is `[n, out]`.
    pub fn add(&self, pool: &ThreadPool, x: &[f32], n: usize, out: &mut [f32]) {
        self.with_delta(pool, x, n, |delta| {
            for (o, d) in out.iter_mut().zip(delta) {
                *o += d * self.scale;
            }
        })
    }

    /// Calls `f` with `B (A x[t])` for the `n` rows of `x` (`[n, out]`, unscaled). Each row's
    /// result is that of the row alone: the adapter's f32/f16 products take one code path
    /// whatever the number of rows, and neither depends on how the pool splits them.
    pub(crate) fn with_delta(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        f: impl FnOnce(&[f32]),
    ) {
        let r = self.a.rows;
        SCRATCH.with_borrow_mut(|(q, mid, delta)| {
            q.quantize(pool, self.a.dtype.vec_dot_type(), x, n, self.a.cols);
            mid.clear();
            mid.resize(n * r, 0.0);
            matmul_min_work(pool, &self.a.view(), q, mid, SPLIT_WORK);
            if self.b.dtype() == DType::F16 {
                // An f16 `B` takes its activations in f16, as ggml's products do.
                for v in mid.iter_mut() {
                    *v = f16::from_f32(*v).to_f32();
                }
            }
            delta.clear();
            delta.resize(n * self.b.out(), 0.0);
            self.b.product(pool, mid, n, delta, SPLIT_WORK);
            f(delta)
        })
    }

    /// `scale · B · A` as `[out × in]` f32 (the merged form's update).
    pub fn delta(&self) -> Vec<f32> {
        let (r, cols, rows) = (self.a.rows, self.a.cols, self.b.out());
        let a = f32_values(&self.a);
        let mut d = vec![0f32; rows * cols];
        for (o, drow) in d.chunks_exact_mut(cols).enumerate() {
            for k in 0..r {
                let s = self.b.get(o, k) * self.scale;
                for (dv, av) in drow.iter_mut().zip(&a[k * cols..(k + 1) * cols]) {
                    *dv += s * av;
                }
            }
        }
        d
    }
}

fn f32_values(m: &Matrix) -> Vec<f32> {
    let mut v = vec![0f32; m.rows * m.cols];
    for (r, row) in v.chunks_exact_mut(m.cols).enumerate() {
        m.view().dequantize_row(r, row);
    }
    v
}

/// A LoRA adapter: the low-rank update of each projection it targets, by the projection's
/// canonical weight name (`blk.{i}.attn_q.weight`...).
pub struct LoraAdapter {
    pub path: PathBuf,
    /// Rank of the first update (PEFT: `r`).
    pub rank: usize,
    pub targets: Vec<(String, Arc<LoraPair>)>,
    /// Index into `targets` by weight name.
    by_name: HashMap<String, usize>,
    /// Unique in the process: names this adapter in prefix-cache keys
    /// ([`LoraSelection::cache_key`]), which a later adapter at the same address must not
    /// match.
    uid: u64,
}

/// A tensor of the adapter file that cannot be used, and why.
fn tensor_err(path: &Path, tensor: &str, msg: impl Into<String>) -> ModelError {
    ModelError::CheckpointTensor {
        path: path.to_path_buf(),
        tensor: tensor.to_string(),
        msg: msg.into(),
    }
}

fn err(path: &Path, key: &str, msg: impl Into<String>) -> ModelError {
    ModelError::Config {
        path: path.to_path_buf(),
        key: key.to_string(),
        msg: msg.into(),
    }
}

impl LoraAdapter {
    fn new(path: PathBuf, rank: usize, targets: Vec<(String, Arc<LoraPair>)>) -> LoraAdapter {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let by_name = targets
            .iter()
            .enumerate()
            .map(|(i, (n, _))| (n.clone(), i))
            .collect();
        LoraAdapter {
            path,
            rank,
            targets,
            by_name,
            uid: NEXT.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The update of the projection whose weight is named `name`, if the adapter targets it.
    pub fn pair(&self, name: &str) -> Option<&LoraPair> {
        self.by_name.get(name).map(|&i| &*self.targets[i].1)
    }

    /// Reads the adapter at `path` for `model`: a PEFT folder (or its
    /// `adapter_model.safetensors`), or a llama.cpp GGUF LoRA. `scale` multiplies the
    /// adapter's own scale. Shapes are checked against the model's projections.
    pub fn open(path: &Path, model: &Model, scale: f32) -> Result<LoraAdapter> {
        Self::open_in_layout(path, model, scale, model.file.is_some())
    }

    /// [`LoraAdapter::open`] for weights in llama.cpp's GGUF layout (`gguf_layout`: query
    /// and key rows permuted where the family's converter permutes them, as in a GGUF
    /// file) or in the checkpoint's (a Hugging Face folder as transformers stores it).
    pub fn open_in_layout(
        path: &Path,
        model: &Model,
        scale: f32,
        gguf_layout: bool,
    ) -> Result<LoraAdapter> {
        if !path.exists() {
            return Err(err(path, "path", "no such adapter file or folder"));
        }
        let is_gguf = path.extension().is_some_and(|e| e == "gguf");
        let adapter = if is_gguf {
            Self::open_gguf(path, scale)?
        } else {
            let dir = if path.is_dir() {
                path.to_path_buf()
            } else {
                path.parent().map(Path::to_path_buf).unwrap_or_default()
            };
            Self::open_peft(&dir, model, scale, gguf_layout)?
        };
        adapter.check(model)?;
        Ok(adapter)
    }

    fn open_peft(
        dir: &Path,
        model: &Model,
        user_scale: f32,
        gguf_layout: bool,
    ) -> Result<LoraAdapter> {
        let cfg_path = dir.join("adapter_config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| {
            err(
                &cfg_path,
                "adapter_config.json",
                format!("cannot read it ({e}): a PEFT adapter folder needs one"),
            )
        })?;
        let c: Value = serde_json::from_str(&text)
            .map_err(|e| err(&cfg_path, "adapter_config.json", e.to_string()))?;
        let field = |k: &str| c.get(k).filter(|v| !v.is_null());
        match field("peft_type").and_then(Value::as_str) {
            None | Some("LORA") => {}
            Some(t) => return Err(err(&cfg_path, "peft_type", format!("'{t}' is not LORA"))),
        }
        let r = field("r")
            .and_then(Value::as_u64)
            .filter(|&r| r > 0)
            .ok_or_else(|| err(&cfg_path, "r", "missing or not a positive integer"))?;
        let alpha = field("lora_alpha")
            .and_then(Value::as_f64)
            .ok_or_else(|| err(&cfg_path, "lora_alpha", "missing or not a number"))?;
        let flag = |k: &str| field(k).and_then(Value::as_bool).unwrap_or(false);
        match field("bias").and_then(Value::as_str) {
            None | Some("none") => {}
            Some(b) => {
                return Err(err(
                    &cfg_path,
                    "bias",
                    format!("'{b}' is not supported (none)"),
                ));
            }
        }
        for k in ["fan_in_fan_out", "use_dora"] {
            if flag(k) {
                return Err(err(&cfg_path, k, "true is not supported"));
            }
        }
        if field("modules_to_save").is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
            return Err(err(
                &cfg_path,
                "modules_to_save",
                "fully trained modules are not supported",
            ));
        }
        for k in ["rank_pattern", "alpha_pattern"] {
            if field(k).is_some_and(|v| v.as_object().is_some_and(|o| !o.is_empty())) {
                return Err(err(&cfg_path, k, "per-module ranks are not supported"));
            }
        }
        let scale = if flag("use_rslora") {
            alpha / (r as f64).sqrt()
        } else {
            alpha / r as f64
        } as f32
            * user_scale;

        let st_path = dir.join("adapter_model.safetensors");
        let st = SafetensorsFile::open(&st_path)?;
        let family = by_gguf(&model.config.arch).or_else(|| by_hf(&model.config.arch));
        let names = family.map(|f| f.hf_names).ok_or_else(|| {
            err(
                &st_path,
                "architecture",
                format!("no Hugging Face names known for '{}'", model.config.arch),
            )
        })?;
        // A GGUF base of a family whose converter permutes the query and key rows (for
        // adjacent-pair RoPE) has them permuted: so must the updates' output rows be.
        let permute = gguf_layout && family.is_some_and(|f| f.gguf.permute_qk);
        let mut targets = Vec::new();
        for a in st
            .tensors()
            .iter()
            .filter(|t| t.name.ends_with(".lora_A.weight"))
        {
            let module = a.name.trim_end_matches(".lora_A.weight");
            let b_name = format!("{module}.lora_B.weight");
            let b = st.tensor(&b_name).ok_or_else(|| {
                tensor_err(&st_path, &b_name, "missing: every lora_A needs its lora_B")
            })?;
            // PEFT prefixes the base model's names with `base_model.model.`.
            let hf = module.strip_prefix("base_model.model.").unwrap_or(module);
            let canonical = names
                .to_canonical(&format!("{hf}.weight"))
                .map(|(c, _)| c)
                .ok_or_else(|| {
                    tensor_err(
                        &st_path,
                        &a.name,
                        format!("targets '{hf}', which is not a projection mica knows"),
                    )
                })?;
            let b_name = format!("{canonical}.lora_b");
            let mut b = adapter_matrix(&st_path, b, st.tensor_data(b), &b_name)?;
            let heads = match canonical.strip_suffix(".weight") {
                Some(s) if s.ends_with(".attn_q") => model.config.n_head,
                Some(s) if s.ends_with(".attn_k") => model.config.n_head_kv,
                _ => 0,
            };
            // (Shapes that do not fit the model are reported by `check`, after loading.)
            let fits = find_linear(model, &canonical).is_some_and(|l| l.w.rows == b.rows);
            if permute && heads > 0 && fits && b.rows.is_multiple_of(2 * heads) {
                let rows = permute_heads(b.view().data, b.rows, heads);
                b = Matrix::owned(&b_name, b.dtype, b.rows, b.cols, rows);
            }
            let a_name = format!("{canonical}.lora_a");
            let pair = LoraPair {
                a: adapter_matrix(&st_path, a, st.tensor_data(a), &a_name)?,
                b: transposed(&b),
                scale,
            };
            targets.push((canonical, Arc::new(pair)));
        }
        if let Some(t) = st
            .tensors()
            .iter()
            .find(|t| !t.name.ends_with(".lora_A.weight") && !t.name.ends_with(".lora_B.weight"))
        {
            return Err(tensor_err(
                &st_path,
                &t.name,
                "is not a LoRA A/B matrix (unsupported adapter content)",
            ));
        }
        if targets.is_empty() {
            return Err(err(
                &st_path,
                "tensors",
                "the adapter has no lora_A matrices",
            ));
        }
        Ok(LoraAdapter::new(dir.to_path_buf(), r as usize, targets))
    }

    fn open_gguf(path: &Path, user_scale: f32) -> Result<LoraAdapter> {
        let file = GgufFile::open(path)?;
        let key = |k: &str| file.get_str(k);
        if key("general.type") != Some("adapter") || key("adapter.type") != Some("lora") {
            return Err(err(
                path,
                "general.type",
                "not a LoRA adapter (general.type = adapter, adapter.type = lora expected)",
            ));
        }
        let alpha = file.get_f32("adapter.lora.alpha");
        let mut targets = Vec::new();
        let mut rank = 0;
        for a in file
            .tensors()
            .iter()
            .filter(|t| t.name.ends_with(".lora_a"))
        {
            let base = a.name.trim_end_matches(".lora_a");
            let b_name = format!("{base}.lora_b");
            let b = file
                .tensors()
                .iter()
                .find(|t| t.name == b_name)
                .ok_or_else(|| {
                    tensor_err(path, &b_name, "missing: every lora_a needs its lora_b")
                })?;
            let a_m = adapter_matrix(path, a, file.tensor_data(a), &a.name)?;
            let b_m = adapter_matrix(path, b, file.tensor_data(b), &b.name)?;
            let r = a_m.rows;
            rank = rank.max(r);
            // llama.cpp: alpha / rank, or 1 without an alpha.
            let scale = alpha.map_or(1.0, |al| al / r as f32) * user_scale;
            targets.push((
                base.to_string(),
                Arc::new(LoraPair {
                    a: a_m,
                    b: transposed(&b_m),
                    scale,
                }),
            ));
        }
        if targets.is_empty() {
            return Err(err(path, "tensors", "the adapter has no .lora_a tensors"));
        }
        Ok(LoraAdapter::new(path.to_path_buf(), rank, targets))
    }

    /// Every target names a projection of `model` with matching shapes.
    fn check(&self, model: &Model) -> Result<()> {
        for (name, pair) in &self.targets {
            let lin = find_linear(model, name).ok_or_else(|| {
                tensor_err(
                    &self.path,
                    name,
                    "the model has no separate projection of this name (fused projections, \
                     embeddings and experts cannot take a LoRA update)",
                )
            })?;
            let (a, b) = (&pair.a, &pair.b);
            if a.cols != lin.w.cols || b.out() != lin.w.rows || a.rows != b.rank() {
                return Err(ModelError::BadShape {
                    path: self.path.clone(),
                    tensor: name.clone(),
                    got: vec![
                        b.out() as u64,
                        b.rank() as u64,
                        a.rows as u64,
                        a.cols as u64,
                    ],
                    expected: vec![
                        lin.w.rows as u64,
                        a.rows as u64,
                        a.rows as u64,
                        lin.w.cols as u64,
                    ],
                });
            }
        }
        Ok(())
    }
}

/// A 2-D f32/f16/bf16 tensor as an owned matrix (`[shape[1] × shape[0]]`): f16 kept as it
/// is (half the memory and bandwidth, as llama.cpp's converter writes adapters by default),
/// f32 and bf16 as f32.
fn adapter_matrix(path: &Path, t: &TensorInfo, bytes: &[u8], name: &str) -> Result<Matrix> {
    let dtype = t
        .dtype()
        .filter(|d| matches!(d, DType::F32 | DType::F16 | DType::BF16));
    let (Some(dtype), &[cols, rows]) = (dtype, &t.shape[..]) else {
        return Err(tensor_err(
            path,
            &t.name,
            format!(
                "a LoRA matrix must be 2-D f32, f16 or bf16 (got {:?}, shape {:?})",
                t.ggml_type, t.shape
            ),
        ));
    };
    let (rows, cols) = (rows as usize, cols as usize);
    if dtype == DType::F16 {
        return Ok(Matrix::owned(name, dtype, rows, cols, bytes.to_vec()));
    }
    let mut v = vec![0f32; rows * cols];
    let rb = dtype.row_bytes(cols).unwrap_or(0);
    for (r, row) in v.chunks_exact_mut(cols).enumerate() {
        quant::dequantize_row(dtype, &bytes[r * rb..(r + 1) * rb], row);
    }
    Ok(Matrix::owned_f32(name, rows, cols, &v))
}

/// An adapter's `B` (f32 or f16, as [`adapter_matrix`] holds it) in the product's layout.
fn transposed(b: &Matrix) -> LowRankB {
    LowRankB::from_bytes(b.dtype, b.rows, b.cols, b.view().data)
}

/// The projection of `model` whose weight is named `name`.
fn find_linear<'m>(model: &'m Model, name: &str) -> Option<&'m Linear> {
    model.linears().into_iter().find(|l| l.w.name == name)
}

impl Model {
    /// Applies `adapter` unmerged: each targeted projection adds its low-rank update to its
    /// output from now on (several adapters add up). The base weights are unchanged.
    pub fn attach_lora(&mut self, adapter: &LoraAdapter) -> Result<()> {
        adapter.check(self)?;
        if self.stream.as_ref().is_some_and(|s| s.streams_head())
            && adapter
                .targets
                .iter()
                .any(|(name, _)| *name == self.output.w.name)
        {
            return Err(ModelError::Streaming(
                "a LoRA adapter cannot update an output head streamed in chunks".into(),
            ));
        }
        for (name, pair) in &adapter.targets {
            for lin in self.linears_mut() {
                if lin.w.name == *name {
                    lin.lora.push(pair.clone());
                }
            }
        }
        Ok(())
    }

    /// Merges `adapter` into the weights: each targeted projection becomes
    /// `W + s·B·A`, held in memory as f32 (quantize afterwards to store it narrower).
    pub fn merge_lora(&mut self, adapter: &LoraAdapter) -> Result<()> {
        adapter.check(self)?;
        if self.stream.is_some() {
            return Err(ModelError::Streaming(
                "a LoRA adapter cannot be merged into streamed layers (attach it unmerged)".into(),
            ));
        }
        for (name, pair) in &adapter.targets {
            let delta = pair.delta();
            for lin in self.linears_mut() {
                if lin.w.name == *name {
                    let mut w = f32_values(&lin.w);
                    for (wv, d) in w.iter_mut().zip(&delta) {
                        *wv += d;
                    }
                    let bytes = w.iter().flat_map(|v| v.to_le_bytes()).collect();
                    lin.w.substitute(DType::F32, bytes);
                }
            }
        }
        Ok(())
    }
}

/// An adapter as a user names it: `[NAME=]PATH[:SCALE]` (scale 1 when absent). The name
/// (letters, digits, `.`, `_`, `-`) is how a server's requests select the adapter.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraSpec {
    pub name: Option<String>,
    pub path: PathBuf,
    pub scale: f32,
}

/// Whether `name` may name an adapter: 1 to 64 letters, digits, `.`, `_` or `-`.
pub fn valid_adapter_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

impl LoraSpec {
    /// The adapter's name: the one given, else the file's stem or the folder's name (other
    /// characters than those of [`valid_adapter_name`] replaced by `_`).
    pub fn name(&self) -> String {
        if let Some(n) = &self.name {
            return n.clone();
        }
        let stem = if self.path.is_dir() {
            self.path.file_name()
        } else {
            self.path.file_stem()
        };
        let stem = stem.map(|s| s.to_string_lossy()).unwrap_or_default();
        let mut n: String = stem
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect();
        if n.is_empty() {
            n = "adapter".into();
        }
        n
    }
}

impl std::str::FromStr for LoraSpec {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<LoraSpec, String> {
        // A leading `NAME=` when it is a valid name (paths may hold `=`).
        if let Some((n, rest)) = s.split_once('=')
            && valid_adapter_name(n)
        {
            let mut spec: LoraSpec = rest.parse()?;
            spec.name = Some(n.to_string());
            return Ok(spec);
        }
        if s.is_empty() {
            return Err("an empty adapter path".into());
        }
        // A trailing `:SCALE` when it parses as a number (paths may hold colons).
        if let Some((p, sc)) = s.rsplit_once(':')
            && let Ok(scale) = sc.parse::<f32>()
        {
            if !scale.is_finite() {
                return Err(format!("scale '{sc}' is not a finite number"));
            }
            if p.is_empty() {
                return Err("an empty adapter path".into());
            }
            return Ok(LoraSpec {
                name: None,
                path: p.into(),
                scale,
            });
        }
        Ok(LoraSpec {
            name: None,
            path: s.into(),
            scale: 1.0,
        })
    }
}

impl crate::LoadedModel {
    /// Opens `spec`'s adapter for this model and applies it unmerged; returns it (for its
    /// rank and targets).
    pub fn attach_lora(&mut self, spec: &LoraSpec) -> Result<LoraAdapter> {
        let adapter = LoraAdapter::open(&spec.path, &self.model, spec.scale)?;
        self.model.attach_lora(&adapter)?;
        Ok(adapter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_with_and_without_a_scale() {
        let p = |s: &str| s.parse::<LoraSpec>();
        let spec = |name: Option<&str>, path: &str, scale| LoraSpec {
            name: name.map(str::to_string),
            path: path.into(),
            scale,
        };
        assert_eq!(p("a/b").unwrap(), spec(None, "a/b", 1.0));
        assert_eq!(p("a/b:0.5").unwrap(), spec(None, "a/b", 0.5));
        assert_eq!(p("c:/x:2").unwrap(), spec(None, "c:/x", 2.0));
        assert_eq!(p("x:y").unwrap(), spec(None, "x:y", 1.0));
        assert_eq!(p("sql=a/b:0.5").unwrap(), spec(Some("sql"), "a/b", 0.5));
        assert_eq!(p("a b=c").unwrap(), spec(None, "a b=c", 1.0));
        assert_eq!(p("a/b=c").unwrap(), spec(None, "a/b=c", 1.0));
        assert!(p("n=").is_err());
        assert_eq!(p("sql=a/b").unwrap().name(), "sql");
        assert_eq!(p("x/my adapter.gguf:2").unwrap().name(), "my_adapter");
        assert!(p("").is_err());
        assert!(p(":1").is_err());
        assert!(p("a:inf").is_err());
    }
}
