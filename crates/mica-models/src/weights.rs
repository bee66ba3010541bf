//! Weights as the model sees them: matrices that stay in the file's memory map, in whatever
//! format the file stores them, behind [`Linear`]. Models never look at the format; the
//! kernels do.

use crate::error::{ModelError, Result};
use crate::lora::LoraPair;
use crate::names::NameTable;
use crate::packed_buf::PackedBytes;
use mica_formats::{CheckpointSet, GgufFile, TensorBytes, TensorInfo};
use mica_kernels::matmul::{QActs, QMatrix, matmul};
use mica_kernels::{DType, ThreadPool, quant};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Where a tensor's bytes live: a range of a mapped file (GGUF, or one safetensors shard),
/// or of a streamed layer's ring slot ([`crate::stream`]).
#[derive(Clone)]
pub struct TensorData {
    file: Arc<dyn TensorBytes>,
    start: usize,
    len: usize,
    /// The bytes are a ring slot's, readable only during their layer's turn of a forward
    /// pass ([`crate::stream`]).
    streamed: bool,
}

impl TensorData {
    pub fn bytes(&self) -> &[u8] {
        &self.file.bytes()[self.start..self.start + self.len]
    }
}

/// A weight matrix: `rows` outputs × `cols` inputs, row-major, in `dtype`.
#[derive(Clone)]
pub struct Matrix {
    pub name: String,
    /// See [`QMatrix::extra_paths`].
    pub extra_paths: bool,
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    data: TensorData,
    /// Optional repacked copy for the kernels ([`Matrix::repack`]); the file's bytes stay
    /// untouched.
    packed: Option<Arc<PackedBytes>>,
}

impl Matrix {
    pub fn view(&self) -> QMatrix<'_> {
        QMatrix {
            dtype: self.dtype,
            rows: self.rows,
            cols: self.cols,
            data: self.data.bytes(),
            extra_paths: self.extra_paths,
            packed: self.packed.as_deref().map(PackedBytes::as_slice),
        }
    }

    /// Makes a repacked copy of the weights in this CPU's packed layout, where the kernels
    /// have one ([`QMatrix::pack`]); products stay bit-identical. The rows are packed a few
    /// MiB at a time and, when `release` is set, the file's pages of each piece are given back
    /// to the OS as soon as it is packed, so the model is never resident twice (anything that
    /// still reads the file's bytes, such as embedding lookups of a tied head, faults its pages
    /// in again). Returns the bytes the copy takes (0 when the type has no packed layout).
    pub fn repack(&mut self, release: bool) -> usize {
        if self.data.streamed || self.data.len == 0 {
            // Read a layer at a time from the file: its bytes are used in the file's layout
            // (products are bit-identical either way). Or evicted: nothing left to pack.
            return 0;
        }
        self.packed = None;
        let rb = self.view().row_bytes();
        let group = self.view().pack_group();
        // Whole groups of rows: packing pieces gives the bytes of packing the whole.
        let step = ((4 << 20) / rb.max(1)).next_multiple_of(group);
        let total = self.rows.div_ceil(group) * group * rb;
        let mut out: Option<PackedBytes> = None;
        let mut written = 0;
        let mut r0 = 0;
        while r0 < self.rows {
            let r1 = (r0 + step).min(self.rows);
            let piece = QMatrix {
                rows: r1 - r0,
                data: &self.data.bytes()[r0 * rb..r1 * rb],
                packed: None,
                ..self.view()
            };
            let Some(p) = piece.pack() else { return 0 };
            if out.is_none() {
                // Out of address space only: the file's layout still works.
                let Ok(buf) = PackedBytes::zeroed(total) else {
                    return 0;
                };
                out = Some(buf);
            }
            let dst = out.as_mut().expect("allocated above").as_mut_slice();
            assert!(
                written + p.len() <= total,
                "{}: packed pieces exceed {total} bytes",
                self.name
            );
            dst[written..written + p.len()].copy_from_slice(&p);
            written += p.len();
            if release {
                self.data
                    .file
                    .release(self.data.start + r0 * rb, (r1 - r0) * rb);
            }
            r0 = r1;
        }
        assert_eq!(written, total, "{}: packed size", self.name);
        self.packed = out.map(Arc::new);
        if self.packed.is_some() { written } else { 0 }
    }

    /// Bytes [`Matrix::repack`] makes (or made) the packed copy take: `None` where the
    /// kernels have no packed layout for this type.
    pub fn repacked_len(&self) -> Option<usize> {
        if self.data.streamed {
            return None;
        }
        match &self.packed {
            Some(p) => Some(p.as_slice().len()),
            None => self.view().packed_len(),
        }
    }

    /// Whether a packed copy exists ([`Matrix::repack`] ran and the type has a layout).
    pub fn is_repacked(&self) -> bool {
        self.packed.is_some()
    }

    /// Bytes the weights occupy.
    pub fn n_bytes(&self) -> usize {
        self.data.len
    }

    /// Whether the weights are streamed from the file a layer at a time ([`crate::stream`]):
    /// their bytes may be read only inside a forward pass, during their layer's turn.
    pub fn is_streamed(&self) -> bool {
        self.data.streamed
    }

    /// The bytes holding the weights in the file's layout and the range of them that is
    /// this matrix's: `(bytes, start, len)`.
    pub(crate) fn source(&self) -> (&Arc<dyn TensorBytes>, usize, usize) {
        (&self.data.file, self.data.start, self.data.len)
    }

    /// Drops the matrix's bytes from this process (its packed copy, and the resident pages
    /// of the file where it is mapped), leaving it empty: for weights now held on another
    /// device. Returns the bytes it held. Its shape stays; nothing may read it afterwards.
    pub(crate) fn evict(&mut self) -> usize {
        let held = self.data.len + self.packed.as_ref().map_or(0, |p| p.as_slice().len());
        self.data.file.release(self.data.start, self.data.len);
        self.packed = None;
        self.data = TensorData {
            file: Arc::new(OwnedBytes(Vec::new())),
            start: 0,
            len: 0,
            streamed: false,
        };
        held
    }

    /// Rows `r0..r0 + rows` as a matrix of their own over the same bytes (no packed copy).
    pub(crate) fn rows_view(&self, r0: usize, rows: usize) -> Matrix {
        let row = self.data.len / self.rows.max(1);
        Matrix {
            name: format!("{}[{r0}..{}]", self.name, r0 + rows),
            rows,
            data: TensorData {
                file: self.data.file.clone(),
                start: self.data.start + r0 * row,
                len: rows * row,
                streamed: self.data.streamed,
            },
            packed: None,
            ..self.clone()
        }
    }

    /// Points the matrix at `start..start + len` of `bytes` (a ring slot of a streamed
    /// layer), dropping any packed copy.
    pub(crate) fn set_streamed(&mut self, bytes: Arc<dyn TensorBytes>, start: usize) {
        self.packed = None;
        self.data = TensorData {
            file: bytes,
            start,
            len: self.data.len,
            streamed: true,
        };
    }

    /// Replaces the weights by `bytes` of type `dtype` held in memory (same rows and
    /// columns), dropping any packed copy: e.g. to measure what quantizing this matrix alone
    /// does to the model's output. Keep a clone of the matrix to put the original back.
    pub fn substitute(&mut self, dtype: DType, bytes: Vec<u8>) {
        let row = dtype
            .row_bytes(self.cols)
            .expect("substitute: the type's block must divide the rows");
        assert_eq!(
            bytes.len(),
            row * self.rows,
            "{}: substitute size",
            self.name
        );
        self.dtype = dtype;
        self.packed = None;
        self.data = TensorData {
            len: bytes.len(),
            file: Arc::new(OwnedBytes(bytes)),
            start: 0,
            streamed: false,
        };
    }
}

impl Matrix {
    /// An F32 matrix over owned values (`[rows × cols]`, row-major): LoRA updates, tests.
    pub fn owned_f32(name: &str, rows: usize, cols: usize, values: &[f32]) -> Matrix {
        assert_eq!(values.len(), rows * cols);
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Matrix::owned(name, DType::F32, rows, cols, bytes)
    }

    /// A matrix over owned bytes of `dtype` (`rows` rows of `cols` elements).
    pub fn owned(name: &str, dtype: DType, rows: usize, cols: usize, bytes: Vec<u8>) -> Matrix {
        assert_eq!(Some(bytes.len()), dtype.row_bytes(cols).map(|r| r * rows));
        Matrix {
            name: name.to_string(),
            extra_paths: true,
            dtype,
            rows,
            cols,
            data: TensorData {
                len: bytes.len(),
                file: Arc::new(OwnedBytes(bytes)),
                start: 0,
                streamed: false,
            },
            packed: None,
        }
    }

    /// [`Matrix::owned_f32`], for unit tests.
    #[cfg(test)]
    pub(crate) fn from_f32(name: &str, rows: usize, cols: usize, values: &[f32]) -> Matrix {
        Matrix::owned_f32(name, rows, cols, values)
    }
}

/// A projection `y = W x (+ b)`, plus the low-rank updates of any LoRA adapters applied
/// unmerged (`+ Σ s·B·A x`).
#[derive(Clone)]
pub struct Linear {
    pub w: Matrix,
    /// `[rows]`
    pub bias: Option<Vec<f32>>,
    /// Unmerged LoRA updates ([`crate::lora`]), added after the bias.
    pub lora: Vec<Arc<LoraPair>>,
}

impl Linear {
    pub fn out_dim(&self) -> usize {
        self.w.rows
    }

    /// `out[t] = W x[t] + b` for the `acts` rows (already quantized for this weight's
    /// format by [`ActCache::get`]); `out` is `[n, rows]`.
    ///
    /// The base product only: [`Linear::apply`] adds the LoRA updates too.
    pub fn forward(&self, pool: &ThreadPool, acts: &QActs, out: &mut [f32]) {
        matmul(pool, &self.w.view(), acts, out);
        if let Some(b) = &self.bias {
            for row in out.chunks_exact_mut(b.len()) {
                for (o, &bb) in row.iter_mut().zip(b) {
                    *o += bb;
                }
            }
        }
    }
}

impl Linear {
    /// A projection of `w` with an optional bias and no LoRA update.
    pub fn new(w: Matrix, bias: Option<Vec<f32>>) -> Linear {
        Linear {
            w,
            bias,
            lora: Vec::new(),
        }
    }

    /// `out[t] = W x[t] + b + Σ s·B·A x[t]` for the `n` rows of `x` (`[n, cols]`), the
    /// activations quantized through `acts` (shared by projections of the same input).
    pub fn apply(
        &self,
        pool: &ThreadPool,
        acts: &mut ActCache,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) {
        let _span = tracing::trace_span!(
            "matmul",
            tokens = n,
            rows = self.w.rows,
            cols = self.w.cols,
            dtype = self.w.dtype.name()
        )
        .entered();
        self.forward(pool, acts.get(pool, &self.w, x, n), out);
        for l in &self.lora {
            l.add(pool, x, n, out);
        }
        if !acts.lora.is_empty() {
            acts.lora.apply(pool, &self.w.name, x, n, out);
        }
    }
}

/// Quantized copies of one activation matrix, one per format needed, so that projections
/// sharing an input (Q, K, V; gate, up) quantize it once per format.
#[derive(Default)]
pub struct ActCache {
    slots: Vec<(DType, QActs, bool)>,
    /// Importance statistics, when collecting them ([`ActCache::get`] sees every matmul
    /// input); `None` costs one branch per projection.
    pub stats: Option<ActStats>,
    /// Products compute every row as a one-row product would ([`QActs::set_alone`]).
    pub alone: bool,
    /// The adapters of the rows' sequences, per row (adapters chosen per sequence).
    pub(crate) lora: crate::lora::RowAdapters,
}

/// Per weight matrix (by tensor name): the sum over input rows of each input column's
/// square, and the number of rows — llama.cpp's importance matrix (`llama-imatrix`) before
/// dividing.
#[derive(Default, Debug)]
pub struct ActStats {
    /// name → (`[cols]` Σ x², rows summed)
    pub sums: HashMap<String, (Vec<f64>, u64)>,
    /// With [`ActStats::with_grams`]: the input's Gram matrix `Σ x xᵀ` (`[cols × cols]`, row-
    /// major, rows summed) — the Hessian of a projection's squared output error that
    /// error-compensating quantizers (GPTQ) use. Projections that read the same input
    /// (Q, K and V; gate and up) share one matrix: see [`ActStats::gram`].
    pub grams: Option<HashMap<String, (Vec<f32>, u64)>>,
    /// name → the name whose Gram matrix it shares.
    pub gram_alias: HashMap<String, String>,
    /// The matrix that the current input was first added as (cleared when the input
    /// changes).
    current: Option<String>,
}

impl ActStats {
    /// Statistics that also gather each input's Gram matrix (memory: `cols²` floats per
    /// distinct input).
    pub fn with_grams() -> ActStats {
        ActStats {
            grams: Some(HashMap::new()),
            ..ActStats::default()
        }
    }

    /// The Gram matrix of `name`'s inputs and the number of rows summed into it.
    pub fn gram(&self, name: &str) -> Option<(&[f32], u64)> {
        let key = self.gram_alias.get(name).map_or(name, String::as_str);
        let (g, n) = self.grams.as_ref()?.get(key)?;
        Some((g, *n))
    }

    /// Adds the rows of `x` (`[n, cols]`) as inputs of `name`.
    pub fn add(&mut self, name: &str, x: &[f32], n: usize, cols: usize) {
        if self.grams.is_some() {
            self.add_gram(name, x, n, cols);
        }
        let (sum, count) = self
            .sums
            .entry(name.to_string())
            .or_insert_with(|| (vec![0.0; cols], 0));
        if sum.len() != cols {
            return;
        }
        for row in x[..n * cols].chunks_exact(cols) {
            for (s, &v) in sum.iter_mut().zip(row) {
                *s += (v as f64) * (v as f64);
            }
        }
        *count += n as u64;
    }

    fn add_gram(&mut self, name: &str, x: &[f32], n: usize, cols: usize) {
        if let Some(first) = &self.current {
            // The same input as an earlier projection of this step (Q after K, up after
            // gate): counted there already.
            if first != name {
                self.gram_alias.insert(name.to_string(), first.clone());
            }
            return;
        }
        self.current = Some(name.to_string());
        let Some(grams) = self.grams.as_mut() else {
            return;
        };
        let (g, count) = grams
            .entry(name.to_string())
            .or_insert_with(|| (vec![0.0; cols * cols], 0));
        if g.len() != cols * cols || n == 0 {
            return;
        }
        // g += xᵀ x: an [cols × n] by [n × cols] product accumulated into g.
        // SAFETY: the strides describe `x` (`[n, cols]` row-major, read as its transpose and
        // as itself) and `g` (`[cols, cols]`); both slices hold at least that many elements.
        unsafe {
            matrixmultiply::sgemm(
                cols,
                n,
                cols,
                1.0,
                x.as_ptr(),
                1,
                cols as isize,
                x.as_ptr(),
                cols as isize,
                1,
                1.0,
                g.as_mut_ptr(),
                cols as isize,
                1,
            );
        }
        *count += n as u64;
    }
}

impl ActCache {
    /// Marks every cached copy stale (call when the input changes).
    pub fn invalidate(&mut self) {
        for s in &mut self.slots {
            s.2 = false;
        }
        if let Some(st) = &mut self.stats {
            st.current = None;
        }
    }

    /// `x` (`[n, cols]`) quantized for a dot product with `w`.
    pub fn get(&mut self, pool: &ThreadPool, w: &Matrix, x: &[f32], n: usize) -> &QActs {
        if let Some(st) = &mut self.stats {
            st.add(&w.name, x, n, w.cols);
        }
        let dt = w.dtype.vec_dot_type();
        let i = match self.slots.iter().position(|s| s.0 == dt) {
            Some(i) => i,
            None => {
                self.slots.push((dt, QActs::new(), false));
                self.slots.len() - 1
            }
        };
        let slot = &mut self.slots[i];
        if !slot.2 {
            slot.1.quantize(pool, dt, x, n, w.cols);
            slot.2 = true;
        }
        slot.1.set_alone(self.alone);
        &self.slots[i].1
    }
}

/// Tensor bytes made at load time: a layout the kernels need that the checkpoint does not
/// store ([`WeightLoader::rewrite`]).
struct OwnedBytes(Vec<u8>);

impl TensorBytes for OwnedBytes {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// `[rows][cols]` elements of `es` bytes → `[cols][rows]`.
pub fn transpose(bytes: &[u8], rows: usize, cols: usize, es: usize) -> Vec<u8> {
    let mut out = vec![0u8; bytes.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (src, dst) = ((r * cols + c) * es, (c * rows + r) * es);
            out[dst..dst + es].copy_from_slice(&bytes[src..src + es]);
        }
    }
    out
}

/// Rows of `row_bytes` bytes reordered: row `i` of the result is row `from(i)` of `bytes`.
pub fn reorder_rows(bytes: &[u8], row_bytes: usize, from: impl Fn(usize) -> usize) -> Vec<u8> {
    let n = bytes.len() / row_bytes.max(1);
    let mut out = Vec::with_capacity(bytes.len());
    for i in 0..n {
        let r = from(i);
        out.extend_from_slice(&bytes[r * row_bytes..(r + 1) * row_bytes]);
    }
    out
}

/// Looks up and validates the tensors of one model for one architecture. Architectures ask
/// by canonical (GGUF-style) name, `blk.{i}.attn_q.weight`; a Hugging Face checkpoint is
/// read through its family's [`NameTable`].
pub struct WeightLoader {
    /// The model file or folder (for errors).
    pub path: PathBuf,
    pub arch: String,
    /// Name in the file → (description, the file holding it).
    tensors: HashMap<String, (TensorInfo, Arc<dyn TensorBytes>)>,
    /// Canonical → file names; `None` for GGUF, whose names are the canonical ones.
    names: Option<&'static NameTable>,
    /// Added to every norm weight ([`WeightLoader::norm`]): Gemma's checkpoints store
    /// `w - 1` for its `(1 + w)` RMSNorm; llama.cpp's converter folds the 1 into the GGUF.
    pub norm_offset: f32,
}

impl WeightLoader {
    /// The tensors of a GGUF file.
    pub fn gguf(file: &Arc<GgufFile>, arch: &str) -> WeightLoader {
        let bytes: Arc<dyn TensorBytes> = file.clone();
        WeightLoader {
            path: file.path().to_path_buf(),
            arch: arch.to_string(),
            tensors: file
                .tensors()
                .iter()
                .map(|t| (t.name.clone(), (t.clone(), bytes.clone())))
                .collect(),
            names: None,
            norm_offset: 0.0,
        }
    }

    /// The tensors of a Hugging Face checkpoint (safetensors or PyTorch), named through
    /// `names`.
    pub fn safetensors(
        set: &CheckpointSet,
        path: PathBuf,
        arch: &str,
        names: &'static NameTable,
    ) -> WeightLoader {
        let mut tensors = HashMap::new();
        for (fi, t) in set.tensors() {
            let bytes: Arc<dyn TensorBytes> = set.files[fi].clone();
            tensors.insert(t.name.clone(), (t.clone(), bytes));
        }
        WeightLoader {
            path,
            arch: arch.to_string(),
            tensors,
            names: Some(names),
            norm_offset: 0.0,
        }
    }

    /// The name a canonical tensor has in the file.
    fn file_name(&self, canonical: &str) -> String {
        match self.names {
            None => canonical.to_string(),
            Some(t) => t.to_file(canonical),
        }
    }

    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(&self.file_name(name)).map(|e| &e.0)
    }

    fn require(&self, name: &str) -> Result<&(TensorInfo, Arc<dyn TensorBytes>)> {
        let file_name = self.file_name(name);
        self.tensors
            .get(&file_name)
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.path.clone(),
                arch: self.arch.clone(),
                tensor: file_name,
            })
    }

    fn dtype_of(&self, t: &TensorInfo) -> Result<DType> {
        t.dtype()
            .filter(|d| DType::WEIGHT_TYPES.contains(d))
            .ok_or_else(|| ModelError::UnsupportedType {
                path: self.path.clone(),
                tensor: t.name.clone(),
                ggml_type: t.ggml_type.name(),
                supported: DType::WEIGHT_TYPES.map(|d| d.name()).join(", "),
            })
    }

    fn check_shape(&self, t: &TensorInfo, expected: &[u64]) -> Result<()> {
        if t.shape != expected {
            return Err(ModelError::BadShape {
                path: self.path.clone(),
                tensor: t.name.clone(),
                expected: expected.to_vec(),
                got: t.shape.clone(),
            });
        }
        Ok(())
    }

    /// Replaces tensor `name` (canonical) by a rearranged copy held in memory:
    /// `f(bytes, element size)` returns the new bytes, of shape `shape` (innermost first).
    /// The tensor must have shape `expected` and an element type (F32, F16, BF16), not a
    /// block format. For checkpoints whose layout the kernels cannot read in place
    /// (GPT-2's transposed Conv1D weights, GPT-NeoX's per-head fused qkv rows).
    pub fn rewrite(
        &mut self,
        name: &str,
        expected: &[u64],
        shape: Vec<u64>,
        f: impl FnOnce(&[u8], usize) -> Vec<u8>,
    ) -> Result<()> {
        let file_name = self.file_name(name);
        let (t, bytes) = self.require(name)?;
        self.check_shape(t, expected)?;
        let dtype = self.dtype_of(t)?;
        if dtype.block_size() != 1 {
            return Err(ModelError::UnsupportedType {
                path: self.path.clone(),
                tensor: t.name.clone(),
                ggml_type: t.ggml_type.name(),
                supported: "F32, F16, BF16 (this tensor is rearranged at load)".into(),
            });
        }
        let data = &bytes.bytes()[t.offset as usize..(t.offset + t.n_bytes) as usize];
        let new = f(data, dtype.type_size());
        let info = TensorInfo {
            shape,
            offset: 0,
            n_bytes: new.len() as u64,
            ..t.clone()
        };
        let owned: Arc<dyn TensorBytes> = Arc::new(OwnedBytes(new));
        self.tensors.insert(file_name, (info, owned));
        Ok(())
    }

    /// Tensor `from` (canonical) is also found as `name` (a GGUF architecture whose file
    /// names a tensor otherwise than the canonical layer asks for it: gpt-oss's feed-forward
    /// norm is `post_attention_norm`). Nothing happens when `from` is absent.
    pub fn alias(&mut self, name: &str, from: &str) {
        if let Some(e) = self.tensors.get(&self.file_name(from)).cloned() {
            let key = self.file_name(name);
            self.tensors.insert(key, e);
        }
    }

    /// A matrix of `rows` outputs × `cols` inputs (shape `[cols, rows]` innermost first).
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let (t, bytes) = self.require(name)?;
        self.check_shape(t, &[cols as u64, rows as u64])?;
        let dtype = self.dtype_of(t)?;
        Ok(Matrix {
            name: name.to_string(),
            extra_paths: name != "token_embd.weight",
            dtype,
            rows,
            cols,
            data: TensorData {
                file: bytes.clone(),
                start: t.offset as usize,
                len: t.n_bytes as usize,
                streamed: false,
            },
            packed: None,
        })
    }

    /// Rows `first..first + rows` of a fused matrix of `total_rows` × `cols` (Phi-3's
    /// `qkv_proj`, `gate_up_proj`; a 3-D expert stack `[n_expert, r, cols]` counts as
    /// `n_expert · r` rows): a view into the same bytes, no copy.
    pub fn matrix_rows(
        &self,
        name: &str,
        first: usize,
        rows: usize,
        total_rows: usize,
        cols: usize,
    ) -> Result<Matrix> {
        let (t, bytes) = self.require(name)?;
        let outer: u64 = t.shape.iter().skip(1).product();
        if t.shape.first() != Some(&(cols as u64)) || outer != total_rows as u64 {
            return Err(ModelError::BadShape {
                path: self.path.clone(),
                tensor: t.name.clone(),
                expected: vec![cols as u64, total_rows as u64],
                got: t.shape.clone(),
            });
        }
        let dtype = self.dtype_of(t)?;
        let row_bytes = t.n_bytes as usize / total_rows.max(1);
        Ok(Matrix {
            name: format!("{name}[{first}..{}]", first + rows),
            extra_paths: true,
            dtype,
            rows,
            cols,
            data: TensorData {
                file: bytes.clone(),
                start: t.offset as usize + first * row_bytes,
                len: rows * row_bytes,
                streamed: false,
            },
            packed: None,
        })
    }

    /// A matrix whose row count is read from the file (e.g. the vocabulary).
    pub fn matrix_any_rows(&self, name: &str, cols: usize) -> Result<Matrix> {
        let (t, _) = self.require(name)?;
        let rows = if t.shape.len() == 2 { t.shape[1] } else { 0 };
        if rows == 0 {
            self.check_shape(t, &[cols as u64, 1])?;
        }
        self.matrix(name, rows as usize, cols)
    }

    /// A vector of `n` floats (norm weights, biases), converted to f32.
    pub fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>> {
        let (t, bytes) = self.require(name)?;
        self.check_shape(t, &[n as u64])?;
        let dtype = self.dtype_of(t)?;
        let mut out = vec![0f32; n];
        let data = &bytes.bytes()[t.offset as usize..(t.offset + t.n_bytes) as usize];
        quant::dequantize_row(dtype, data, &mut out);
        Ok(out)
    }

    /// A tensor of any rank as f32, row-major; its shape (innermost first) must be `shape`
    /// once dimensions of 1 are dropped from both (a checkpoint's `[c, 1, k]` convolution
    /// is GGUF's `[c, k]`).
    pub fn array(&self, name: &str, shape: &[u64]) -> Result<Vec<f32>> {
        let (t, bytes) = self.require(name)?;
        let squeeze = |s: &[u64]| s.iter().copied().filter(|&x| x != 1).collect::<Vec<_>>();
        if squeeze(&t.shape) != squeeze(shape) {
            return Err(ModelError::BadShape {
                path: self.path.clone(),
                tensor: t.name.clone(),
                expected: shape.to_vec(),
                got: t.shape.clone(),
            });
        }
        let dtype = self.dtype_of(t)?;
        let mut out = vec![0f32; shape.iter().product::<u64>() as usize];
        let data = &bytes.bytes()[t.offset as usize..(t.offset + t.n_bytes) as usize];
        quant::dequantize_row(dtype, data, &mut out);
        Ok(out)
    }

    pub fn vector_opt(&self, name: &str, n: usize) -> Result<Option<Vec<f32>>> {
        match self.info(name) {
            None => Ok(None),
            Some(_) => self.vector(name, n).map(Some),
        }
    }

    /// A norm weight of `n` floats, plus [`WeightLoader::norm_offset`].
    pub fn norm(&self, name: &str, n: usize) -> Result<Vec<f32>> {
        let mut v = self.vector(name, n)?;
        if self.norm_offset != 0.0 {
            for x in &mut v {
                *x += self.norm_offset;
            }
        }
        Ok(v)
    }

    /// A projection with an optional `{prefix}.bias`.
    pub fn linear(&self, prefix: &str, rows: usize, cols: usize) -> Result<Linear> {
        Ok(Linear::new(
            self.matrix(&format!("{prefix}.weight"), rows, cols)?,
            self.vector_opt(&format!("{prefix}.bias"), rows)?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_and_reorder_rows_move_whole_elements() {
        // [2][3] of 2-byte elements → [3][2].
        let src: Vec<u8> = (0..12).collect();
        let t = transpose(&src, 2, 3, 2);
        assert_eq!(t, [0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]);
        assert_eq!(transpose(&t, 3, 2, 2), src);
        // Rows of 4 bytes, reversed.
        let r = reorder_rows(&src, 4, |i| 2 - i);
        assert_eq!(r, [8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3]);
    }
}
