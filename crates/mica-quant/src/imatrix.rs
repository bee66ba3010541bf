//! Importance matrices: for each weight matrix, the mean over calibration tokens of each
//! input column's squared activation — what llama.cpp's `llama-imatrix` computes and
//! `llama-quantize --imatrix` consumes. [`collect`] computes one over calibration text
//! (`mica imatrix`), [`Imatrix::write`] and [`Imatrix::read`] store it, and a conversion
//! with [`Importance`](crate::Importance) weighs the quantizers' error by it.
//!
//! Files, both as llama.cpp (0c1e57098) reads them (`common/imatrix-loader.cpp`):
//! - **GGUF** (what `llama-imatrix` writes by default, and what mica writes): per matrix
//!   `NAME.in_sum2` (F32 `[cols, n_mat]`, Σ x² over the tokens) and `NAME.counts`
//!   (F32 `[1, n_mat]`, tokens counted); keys `general.type = "imatrix"`,
//!   `imatrix.datasets`, `imatrix.chunk_count`, `imatrix.chunk_size`. Mean = sum / count.
//! - **legacy `.dat`** (`--output-format dat`): `i32 n_entries`, then per entry
//!   `i32 len, name, i32 ncall, i32 nval, f32 × nval` with values `mean · ncall`, then
//!   `i32 last_chunk` and the dataset name. Mean = value / ncall.
//!
//! Collection runs the model over non-overlapping windows of the text (each from an empty
//! cache), with the forward pass's statistics hook on (`Workspace::collect_act_stats`).

use crate::error::{QuantError, Result};
use crate::progress::{Event, Task};
use mica_formats::atomic::AtomicFile;
use mica_formats::ggml_types::GgmlType;
use mica_formats::{GgufFile, GgufWriter, MetaArray, MetaValue};
use mica_kernels::ThreadPool;
use mica_models::weights::ActStats;
use mica_models::{Batch, KvCache, LoadedModel, Workspace};
use std::collections::BTreeMap;
use std::path::Path;

/// Per-matrix sums of squared inputs.
#[derive(Clone, Debug, Default)]
pub struct Imatrix {
    /// name → (`[cols]` Σ x², tokens counted)
    pub entries: BTreeMap<String, (Vec<f32>, f32)>,
    pub datasets: Vec<String>,
    pub chunk_count: u32,
    pub chunk_size: u32,
}

impl Imatrix {
    /// The mean squared activation per column of `name` (llama-quantize's weights), or
    /// `None` when the matrix has no entry or none of it was exercised.
    pub fn weights(&self, name: &str) -> Option<Vec<f32>> {
        let (sum, count) = self.entries.get(name)?;
        (*count > 0.0).then(|| sum.iter().map(|s| s / count).collect())
    }

    /// Reads a GGUF or legacy `.dat` imatrix file.
    pub fn read(path: &Path) -> Result<Imatrix> {
        let bytes = std::fs::read(path).map_err(|cause| QuantError::Io {
            path: path.into(),
            cause,
        })?;
        if bytes.starts_with(b"GGUF") {
            Self::read_gguf(path)
        } else {
            Self::read_dat(&bytes).map_err(|msg| QuantError::ImatrixDat {
                path: path.into(),
                msg,
            })
        }
    }

    fn read_gguf(path: &Path) -> Result<Imatrix> {
        let f = GgufFile::open(path)?;
        let mut m = Imatrix {
            datasets: f
                .get_str_array("imatrix.datasets")
                .map(<[String]>::to_vec)
                .unwrap_or_default(),
            chunk_count: f.get_u32("imatrix.chunk_count").unwrap_or(0),
            chunk_size: f.get_u32("imatrix.chunk_size").unwrap_or(0),
            ..Imatrix::default()
        };
        let f32s = |t: &mica_formats::TensorInfo| -> Result<Vec<f32>> {
            if t.ggml_type != GgmlType(0) {
                return Err(QuantError::ImatrixNotF32 {
                    path: path.into(),
                    tensor: t.name.clone(),
                });
            }
            Ok(f.tensor_data(t)
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect())
        };
        for t in f.tensors() {
            let Some(name) = t.name.strip_suffix(".in_sum2") else {
                continue;
            };
            let counts_name = format!("{name}.counts");
            let c = f
                .tensor(&counts_name)
                .ok_or_else(|| QuantError::ImatrixNoCounts {
                    path: path.into(),
                    tensor: t.name.clone(),
                    counts: counts_name.clone(),
                })?;
            let sums = f32s(t)?;
            let counts = f32s(c)?;
            if counts.len() != 1 {
                // Mixture-of-experts matrices (one row of sums per expert): not used by
                // mica's converter, which quantizes 2-D matrices only.
                continue;
            }
            m.entries.insert(name.to_string(), (sums, counts[0]));
        }
        if m.entries.is_empty() {
            return Err(QuantError::NotAnImatrix { path: path.into() });
        }
        Ok(m)
    }

    /// Parses the legacy format; the error says what is wrong.
    fn read_dat(b: &[u8]) -> Result<Imatrix, String> {
        let mut pos = 0usize;
        let i32_at = |pos: &mut usize| -> Result<i32, String> {
            let v = b.get(*pos..*pos + 4).ok_or("truncated")?;
            *pos += 4;
            Ok(i32::from_le_bytes([v[0], v[1], v[2], v[3]]))
        };
        let n = i32_at(&mut pos)?;
        if !(1..=1_000_000).contains(&n) {
            return Err(format!("bad entry count {n}"));
        }
        let mut m = Imatrix::default();
        for _ in 0..n {
            let len = i32_at(&mut pos)? as usize;
            let name = b.get(pos..pos + len).ok_or("truncated name")?;
            let name =
                String::from_utf8(name.to_vec()).map_err(|e| format!("name is not UTF-8: {e}"))?;
            pos += len;
            let ncall = i32_at(&mut pos)?;
            let nval = i32_at(&mut pos)? as usize;
            let data = b.get(pos..pos + 4 * nval).ok_or("truncated values")?;
            pos += 4 * nval;
            let vals: Vec<f32> = data
                .chunks_exact(4)
                .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                .collect();
            // Stored as mean · ncall: keep (sum, count) = (value, ncall) so sum/count = mean.
            let count = if ncall > 0 { ncall as f32 } else { 1.0 };
            m.entries.insert(name, (vals, count));
        }
        if let Ok(last) = i32_at(&mut pos) {
            m.chunk_count = last.max(0) as u32;
            if let Ok(len) = i32_at(&mut pos)
                && let Some(s) = b.get(pos..pos + len.max(0) as usize)
            {
                m.datasets.push(String::from_utf8_lossy(s).into_owned());
            }
        }
        Ok(m)
    }

    /// Writes the GGUF form (atomically).
    pub fn write(&self, path: &Path) -> Result<()> {
        let mut w = GgufWriter::new();
        w.meta("general.type", MetaValue::String("imatrix".into()));
        w.meta(
            "imatrix.datasets",
            MetaValue::Array(MetaArray::String(self.datasets.clone())),
        );
        w.meta("imatrix.chunk_count", MetaValue::U32(self.chunk_count));
        w.meta("imatrix.chunk_size", MetaValue::U32(self.chunk_size));
        let data: Vec<(String, Vec<u8>, Vec<u8>, u64)> = self
            .entries
            .iter()
            .map(|(name, (sum, count))| {
                (
                    name.clone(),
                    sum.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    count.to_le_bytes().to_vec(),
                    sum.len() as u64,
                )
            })
            .collect();
        for (name, sums, counts, cols) in &data {
            w.tensor(&format!("{name}.in_sum2"), GgmlType(0), &[*cols, 1], sums);
            w.tensor(&format!("{name}.counts"), GgmlType(0), &[1, 1], counts);
        }
        let mut f = AtomicFile::create(path)?;
        f.write_all(&w.to_bytes())?;
        f.commit()?;
        Ok(())
    }
}

/// How calibration text is cut: windows of `n_ctx` tokens, at most `max` of them.
#[derive(Clone, Copy, Debug)]
pub struct Windows {
    pub n_ctx: usize,
    pub max: Option<usize>,
}

/// Runs `lm` over `text` in [`Windows`] and collects the statistics; `dataset` names the
/// text in the file. Reports a [`Task::Calibrate`] to `on_event`.
pub fn collect(
    lm: &LoadedModel,
    text: &str,
    dataset: &str,
    windows: Windows,
    threads: usize,
    on_event: &mut dyn FnMut(Event),
) -> Result<Imatrix> {
    collect_with(lm, text, dataset, windows, threads, false, on_event).map(|r| r.0)
}

/// [`collect`], and with `grams` each input's Gram matrix too (for GPTQ).
pub fn collect_with(
    lm: &LoadedModel,
    text: &str,
    dataset: &str,
    Windows { n_ctx, max }: Windows,
    threads: usize,
    grams: bool,
    on_event: &mut dyn FnMut(Event),
) -> Result<(Imatrix, Option<ActStats>)> {
    let tokens = lm.tokenizer.encode(text, true, false)?;
    if n_ctx == 0 || tokens.len() < n_ctx {
        return Err(QuantError::CalibrationTooShort {
            tokens: tokens.len(),
            n_ctx,
        });
    }
    let most = tokens.len() / n_ctx;
    let n_chunk = max.map_or(most, |c| c.clamp(1, most));
    let pool = ThreadPool::new(threads);
    let mut ws = Workspace::default();
    if grams {
        ws.collect_act_grams();
    } else {
        ws.collect_act_stats();
    }
    on_event(Event::Start {
        task: Task::Calibrate,
        total: n_chunk as u64,
    });
    let (add_bos, bos) = (lm.tokenizer.add_bos(), lm.tokenizer.bos());
    for i in 0..n_chunk {
        let mut window = tokens[i * n_ctx..(i + 1) * n_ctx].to_vec();
        if add_bos && let Some(b) = bos {
            window[0] = b;
        }
        let mut kv = KvCache::new(&lm.model.config, n_ctx, 1);
        lm.model
            .forward(
                &pool,
                // All rows produce logits: the forward otherwise skips the last layer's
                // work on rows whose logits nobody reads, and their statistics with it.
                &Batch::for_sequence(&window, 0, 0, true),
                &mut kv,
                &mut ws,
            )
            .map_err(|cause| QuantError::CalibrationForward { cause })?;
        on_event(Event::Advance(1));
    }
    on_event(Event::Finish);
    let mut stats = ws.take_act_stats().unwrap_or_default();
    let m = Imatrix {
        entries: std::mem::take(&mut stats.sums)
            .into_iter()
            .map(|(k, (s, c))| (k, (s.iter().map(|&v| v as f32).collect(), c as f32)))
            .collect(),
        datasets: vec![dataset.to_string()],
        chunk_count: n_chunk as u32,
        chunk_size: n_ctx as u32,
    };
    Ok((m, grams.then_some(stats)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_round_trip_and_legacy_dat() {
        let dir = std::env::temp_dir().join(format!("mica-imatrix-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut m = Imatrix {
            datasets: vec!["text".into()],
            chunk_count: 3,
            chunk_size: 64,
            ..Imatrix::default()
        };
        m.entries
            .insert("blk.0.attn_q.weight".into(), (vec![2.0, 4.0, 8.0], 2.0));
        let p = dir.join("m.gguf");
        m.write(&p).unwrap();
        let r = Imatrix::read(&p).unwrap();
        assert_eq!(r.weights("blk.0.attn_q.weight"), Some(vec![1.0, 2.0, 4.0]));
        assert_eq!((r.chunk_count, r.chunk_size), (3, 64));
        assert_eq!(r.weights("missing"), None);

        // Legacy: one entry, ncall 4, values mean·ncall.
        let mut b = Vec::new();
        b.extend(1i32.to_le_bytes());
        let name = b"output.weight";
        b.extend((name.len() as i32).to_le_bytes());
        b.extend(name);
        b.extend(4i32.to_le_bytes());
        b.extend(2i32.to_le_bytes());
        for v in [4.0f32, 12.0] {
            b.extend(v.to_le_bytes());
        }
        b.extend(4i32.to_le_bytes());
        b.extend(4i32.to_le_bytes());
        b.extend(b"data");
        let p = dir.join("m.dat");
        std::fs::write(&p, &b).unwrap();
        let r = Imatrix::read(&p).unwrap();
        assert_eq!(r.weights("output.weight"), Some(vec![1.0, 3.0]));
        assert_eq!(r.datasets, vec!["data".to_string()]);
        std::fs::write(&p, &b[..10]).unwrap();
        assert!(Imatrix::read(&p).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
