//! A model's checkpoint as a folder holds it: one safetensors or PyTorch file, or the shards
//! an index names. Files of either format are read through [`TensorFile`], so model
//! loading and conversion do not care which one a folder has.

use crate::error::{FormatError, Result};
use crate::pytorch::TorchFile;
use crate::safetensors::SafetensorsFile;
use crate::tensor::{TensorFile, TensorInfo};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A checkpoint of one or more files: `model.safetensors` or `pytorch_model.bin`, the
/// shards named by `model.safetensors.index.json` / `pytorch_model.bin.index.json`
/// (`{"weight_map": {tensor: file}}`), or a folder's one `.pt` / `.pth` file.
pub struct CheckpointSet {
    pub files: Vec<Arc<dyn TensorFile>>,
    /// Tensor name → (file index, tensor index in that file).
    index: HashMap<String, (usize, usize)>,
}

impl CheckpointSet {
    /// Opens the checkpoint in `dir` (safetensors first, then PyTorch). Every shard an
    /// index names must exist and hold the tensors the index assigns to it; errors name the
    /// shard and the tensor.
    pub fn open_dir(dir: impl AsRef<Path>) -> Result<CheckpointSet> {
        let dir = dir.as_ref();
        let st =
            |p: &Path| -> Result<Arc<dyn TensorFile>> { Ok(Arc::new(SafetensorsFile::open(p)?)) };
        let pt = |p: &Path| -> Result<Arc<dyn TensorFile>> { Ok(Arc::new(TorchFile::open(p)?)) };
        let (files, expected) = if dir.join("model.safetensors.index.json").is_file() {
            shards(dir, &dir.join("model.safetensors.index.json"), &st)?
        } else if dir.join("model.safetensors").is_file() {
            (vec![st(&dir.join("model.safetensors"))?], Vec::new())
        } else if dir.join("pytorch_model.bin.index.json").is_file() {
            shards(dir, &dir.join("pytorch_model.bin.index.json"), &pt)?
        } else if dir.join("pytorch_model.bin").is_file() {
            (vec![pt(&dir.join("pytorch_model.bin"))?], Vec::new())
        } else {
            let state_dicts = files_with(dir, &["pt", "pth"]);
            match state_dicts.as_slice() {
                [one] => (vec![pt(one)?], Vec::new()),
                _ => {
                    return Err(FormatError::Io {
                        path: dir.to_path_buf(),
                        cause: std::io::Error::new(
                            std::io::ErrorKind::NotFound,
                            format!(
                                "no checkpoint in the folder: model.safetensors, \
                                 pytorch_model.bin, their .index.json for shards, or one \
                                 .pt / .pth state dict ({} found)",
                                state_dicts.len()
                            ),
                        ),
                    });
                }
            }
        };
        let mut index = HashMap::new();
        for (fi, f) in files.iter().enumerate() {
            for (ti, t) in f.tensors().iter().enumerate() {
                index.insert(t.name.clone(), (fi, ti));
            }
        }
        for (tensor, fi) in &expected {
            let left_out = files[*fi].left_out().iter().any(|n| n == tensor);
            if !left_out && index.get(tensor).map(|e| e.0) != Some(*fi) {
                return Err(FormatError::Tensor {
                    path: files[*fi].path().to_path_buf(),
                    tensor: tensor.clone(),
                    msg: "the index puts this tensor in this shard, but the shard lacks it".into(),
                });
            }
        }
        Ok(CheckpointSet { files, index })
    }

    /// A tensor and the file holding it.
    pub fn tensor(&self, name: &str) -> Option<(&Arc<dyn TensorFile>, &TensorInfo)> {
        self.index
            .get(name)
            .map(|&(f, t)| (&self.files[f], &self.files[f].tensors()[t]))
    }

    /// Every tensor with the index of its file, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = (usize, &TensorInfo)> {
        self.files
            .iter()
            .enumerate()
            .flat_map(|(i, f)| f.tensors().iter().map(move |t| (i, t)))
    }
}

/// The files directly in `dir` whose extension is one of `exts` (any case), sorted.
pub fn files_with(dir: &Path, exts: &[&str]) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| exts.iter().any(|x| e.eq_ignore_ascii_case(x)))
        })
        .collect();
    out.sort();
    out
}

type Shards = (Vec<Arc<dyn TensorFile>>, Vec<(String, usize)>);

/// The shards an index file names, opened with `open`, and which shard each tensor is in.
fn shards(
    dir: &Path,
    index_path: &Path,
    open: &dyn Fn(&Path) -> Result<Arc<dyn TensorFile>>,
) -> Result<Shards> {
    let mut files = Vec::new();
    let mut expected: Vec<(String, usize)> = Vec::new();
    let text = std::fs::read_to_string(index_path).map_err(|cause| FormatError::Io {
        path: index_path.to_path_buf(),
        cause,
    })?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| FormatError::Parse {
        path: index_path.to_path_buf(),
        offset: 0,
        msg: format!("not valid JSON: {e}"),
    })?;
    let map = json["weight_map"]
        .as_object()
        .ok_or_else(|| FormatError::Metadata {
            path: index_path.to_path_buf(),
            key: "weight_map".into(),
            msg: "missing or not an object of tensor → shard file".into(),
        })?;
    let mut shard_names: Vec<String> = Vec::new();
    for (tensor, shard) in map {
        let shard = shard.as_str().ok_or_else(|| FormatError::Metadata {
            path: index_path.to_path_buf(),
            key: format!("weight_map.{tensor}"),
            msg: "not a file name".into(),
        })?;
        if shard.contains('/') || shard.contains('\\') || shard.starts_with('.') {
            return Err(FormatError::Metadata {
                path: index_path.to_path_buf(),
                key: format!("weight_map.{tensor}"),
                msg: format!("shard '{shard}' is not a plain file name"),
            });
        }
        let i = match shard_names.iter().position(|s| s == shard) {
            Some(i) => i,
            None => {
                shard_names.push(shard.to_string());
                shard_names.len() - 1
            }
        };
        expected.push((tensor.clone(), i));
    }
    for name in &shard_names {
        let p = dir.join(name);
        if !p.is_file() {
            return Err(FormatError::Metadata {
                path: index_path.to_path_buf(),
                key: "weight_map".into(),
                msg: format!(
                    "shard {} is missing (it holds tensor '{}')",
                    p.display(),
                    expected
                        .iter()
                        .find(|e| shard_names[e.1] == *name)
                        .map_or("", |e| e.0.as_str())
                ),
            });
        }
        files.push(open(&p)?);
    }
    Ok((files, expected))
}
