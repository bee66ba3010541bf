//! `mica convert --lora`: LoRA adapters merged into the source's weights before conversion
//! (`W + s·B·A` in f32, in the GGUF layout the converter reads — query and key rows
//! permuted where the family's converter permutes them), so the written file is the
//! fine-tuned model, quantized after merging to whatever type the conversion asks for.

use super::source::Source;
use crate::error::Result;
use mica_formats::GgufFile;
use mica_formats::ggml_types::GgmlType;
use mica_kernels::quant;
use mica_models::hf::HfFolder;
use mica_models::lora::{LoraAdapter, LoraSpec};
use mica_models::{Model, ModelError};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// The model at `path` as its family's loader builds it (for the adapters' names and
/// shapes; no tokenizer needed).
fn open_model(path: &Path) -> Result<Model> {
    Ok(if path.is_dir() {
        mica_models::arch::load_hf(&HfFolder::open(path)?)?
    } else {
        mica_models::arch::load_gguf(Arc::new(GgufFile::open(path)?))?
    })
}

/// Merges `specs` into `src` (summing when several update one tensor) and returns each
/// merged tensor's index with its stored type before merging.
pub fn merge(src: &mut Source, path: &Path, specs: &[LoraSpec]) -> Result<Vec<(usize, GgmlType)>> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let model = open_model(path)?;
    let mut merged: BTreeMap<usize, Vec<f32>> = BTreeMap::new();
    for spec in specs {
        let adapter = LoraAdapter::open_in_layout(&spec.path, &model, spec.scale, true)?;
        for (name, pair) in &adapter.targets {
            let i = src
                .tensors()
                .iter()
                .position(|t| t.name == *name)
                .ok_or_else(|| ModelError::CheckpointTensor {
                    path: spec.path.clone(),
                    tensor: name.clone(),
                    msg: "targets a tensor the source does not have".into(),
                })?;
            let w = match merged.entry(i) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => e.insert(f32_tensor(src, i)?),
            };
            for (x, d) in w.iter_mut().zip(pair.delta()) {
                *x += d;
            }
        }
    }
    let originals = merged
        .keys()
        .map(|&i| (i, src.tensors()[i].ggml_type))
        .collect();
    for (i, w) in merged {
        src.replace_f32(i, &w);
    }
    Ok(originals)
}

/// Tensor `i` of `src` as f32 values.
fn f32_tensor(src: &Source, i: usize) -> Result<Vec<f32>> {
    let t = &src.tensors()[i];
    let dtype = t.dtype().ok_or_else(|| ModelError::CheckpointTensor {
        path: Default::default(),
        tensor: t.name.clone(),
        msg: format!("has type {}, which mica cannot read", t.ggml_type.name()),
    })?;
    let cols = t.shape[0] as usize;
    let rows = (t.n_elements() / t.shape[0]) as usize;
    let rb = dtype.row_bytes(cols).unwrap_or(0);
    let data = src.data(i)?;
    let mut out = vec![0f32; rows * cols];
    for (r, row) in out.chunks_exact_mut(cols).enumerate() {
        quant::dequantize_row(dtype, &data[r * rb..(r + 1) * rb], row);
    }
    Ok(out)
}
