//! PyTorch checkpoints (`pytorch_model.bin`, `.pt`, `.pth`: what `torch.save` of a state
//! dict writes), read without running any of their code.
//!
//! Since PyTorch 1.6 such a file is a zip archive: `<name>/data.pkl` is a pickle of the
//! state dict in which each tensor refers to a storage by key, and each storage's bytes
//! are the archive member `<name>/data/<key>`, stored uncompressed (and aligned). The pickle
//! is read by the restricted machine of [`pickle`] — an allow-list of the names a state
//! dict uses, nothing called — and the tensors become [`TensorInfo`]s pointing into the
//! memory-mapped archive, as safetensors tensors do: zero-copy, validated at open (member
//! present, stored, range inside it; tensor contiguous). Older files (PyTorch's legacy
//! format, a bare pickle followed by raw storages) are refused with a clear message.
//!
//! Tensors of a type mica never computes with (bool masks, `uint8`) are left out of the
//! index and listed by [`TorchFile::skipped`]; a model that needs one then reports it as
//! missing. Reference: `torch/serialization.py` (`_save`, `_load`).

pub mod pickle;

use crate::error::{FormatError, Result};
use crate::ggml_types::GgmlType;
use crate::tensor::{TensorBytes, TensorFile, TensorInfo};
use memmap2::Mmap;
use pickle::{TensorRef, TorchDtype, Value};
use std::fs::File;
use std::io::Cursor;
use std::path::{Path, PathBuf};

/// An open, validated PyTorch checkpoint.
pub struct TorchFile {
    path: PathBuf,
    mmap: Mmap,
    tensors: Vec<TensorInfo>,
    skipped: Vec<(String, TorchDtype)>,
}

impl TorchFile {
    /// Opens, maps and validates a PyTorch zip checkpoint.
    pub fn open(path: impl AsRef<Path>) -> Result<TorchFile> {
        let path = path.as_ref().to_path_buf();
        let io = |cause| FormatError::Io {
            path: path.clone(),
            cause,
        };
        let file = File::open(&path).map_err(io)?;
        // SAFETY: read-only private map; see `GgufFile::open` for the truncation caveat.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        let (tensors, skipped) = parse(&path, &mmap)?;
        Ok(TorchFile {
            path,
            mmap,
            tensors,
            skipped,
        })
    }

    /// Tensors left out: their names and element types (see the module docs).
    pub fn skipped(&self) -> &[(String, TorchDtype)] {
        &self.skipped
    }
}

impl TensorBytes for TorchFile {
    fn bytes(&self) -> &[u8] {
        &self.mmap
    }

    fn release(&self, start: usize, len: usize) {
        crate::tensor::release_mapped(&self.mmap, start, len);
    }
}

impl TensorFile for TorchFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn format(&self) -> &'static str {
        "PyTorch (pickle read without running it)"
    }

    fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    fn left_out(&self) -> Vec<String> {
        self.skipped.iter().map(|s| s.0.clone()).collect()
    }
}

/// The ggml type mica reads a PyTorch element type as, if any.
fn ggml_type(d: TorchDtype) -> Option<u32> {
    Some(match d {
        TorchDtype::F32 => 0,
        TorchDtype::F16 => 1,
        TorchDtype::BF16 => 30,
        TorchDtype::I8 => 24,
        TorchDtype::I16 => 25,
        TorchDtype::I32 => 26,
        TorchDtype::I64 => 27,
        TorchDtype::F64 => 28,
        TorchDtype::U8 | TorchDtype::Bool => return None,
    })
}

type Parsed = (Vec<TensorInfo>, Vec<(String, TorchDtype)>);

fn parse(path: &Path, bytes: &[u8]) -> Result<Parsed> {
    let perr = |offset: u64, msg: String| FormatError::Parse {
        path: path.to_path_buf(),
        offset,
        msg,
    };
    if !bytes.starts_with(b"PK\x03\x04") {
        let msg = if bytes.starts_with(b"\x80") {
            "a PyTorch checkpoint in the legacy format (saved before PyTorch 1.6 or with \
             _use_new_zipfile_serialization=False), which mica does not read: re-save it with \
             torch.save from a current PyTorch, or as safetensors"
        } else {
            "not a PyTorch checkpoint (a zip archive written by torch.save)"
        };
        return Err(perr(0, msg.into()));
    }
    let mut zip = zip::ZipArchive::new(Cursor::new(bytes))
        .map_err(|e| perr(0, format!("not a readable zip archive: {e}")))?;
    let pkl_names: Vec<String> = zip
        .file_names()
        .filter_map(|n| n.ok().map(|n| n.into_owned()))
        .filter(|n| n == "data.pkl" || n.ends_with("/data.pkl"))
        .collect();
    let [pkl_name] = pkl_names.as_slice() else {
        return Err(perr(
            0,
            format!(
                "expected one data.pkl in the archive, found {}",
                pkl_names.len()
            ),
        ));
    };
    let prefix = pkl_name
        .strip_suffix("data.pkl")
        .unwrap_or_default()
        .to_string();
    // A member's bytes, as a range of the file: it must be stored, not compressed.
    let mut member = |name: &str| -> Result<(u64, u64)> {
        let f = zip
            .by_name(name)
            .map_err(|e| perr(0, format!("archive member {name}: {e}")))?;
        if f.compression() != zip::CompressionMethod::Stored {
            return Err(perr(
                f.header_start(),
                format!(
                    "archive member {name} is compressed; torch.save stores members as they are"
                ),
            ));
        }
        let start = f.data_start().unwrap_or(u64::MAX);
        let len = f.size();
        match start.checked_add(len) {
            Some(end) if end <= bytes.len() as u64 => Ok((start, len)),
            _ => Err(perr(
                f.header_start(),
                format!("archive member {name} runs past the end of the file"),
            )),
        }
    };
    let (pkl_start, pkl_len) = member(pkl_name)?;
    let pkl = &bytes[pkl_start as usize..(pkl_start + pkl_len) as usize];
    let value = pickle::load(pkl).map_err(|e| {
        perr(
            pkl_start + e.offset as u64,
            format!("{pkl_name} (a pickle): {}", e.msg),
        )
    })?;
    let entries = state_dict(value).ok_or_else(|| {
        perr(
            pkl_start,
            format!("{pkl_name} holds no state dict (a dict of names to tensors)"),
        )
    })?;
    let mut tensors = Vec::new();
    let mut skipped = Vec::new();
    for (name, t) in entries {
        let terr = |msg: String| FormatError::Tensor {
            path: path.to_path_buf(),
            tensor: name.clone(),
            msg,
        };
        let Some(ty) = ggml_type(t.storage.dtype) else {
            skipped.push((name.clone(), t.storage.dtype));
            continue;
        };
        let ggml_type = GgmlType(ty);
        let elem = t.storage.dtype.size();
        // Contiguous, row-major: each stride the product of the sizes inside it (a
        // dimension of size 1 may have any stride).
        let mut want = 1u64;
        for (&size, &stride) in t.shape.iter().zip(&t.stride).rev() {
            if size != 1 && stride != want {
                return Err(terr(format!(
                    "not contiguous (size {:?}, stride {:?}); save it with .contiguous()",
                    t.shape, t.stride
                )));
            }
            want = want
                .checked_mul(size)
                .ok_or_else(|| terr(format!("size {:?} overflows", t.shape)))?;
        }
        let n = want;
        let (m_start, m_len) = member(&format!("{prefix}data/{}", t.storage.key))?;
        let storage_bytes = t.storage.numel.checked_mul(elem);
        let range = t
            .offset
            .checked_add(n)
            .and_then(|end| end.checked_mul(elem))
            .filter(|&end| storage_bytes.is_some_and(|s| end <= s) && end <= m_len);
        if range.is_none() {
            return Err(terr(format!(
                "elements {}..{}+{} of storage {} run past its {} bytes",
                t.offset, t.offset, n, t.storage.key, m_len
            )));
        }
        tensors.push(TensorInfo {
            name: name.clone(),
            ggml_type,
            shape: t.shape.iter().rev().copied().collect(),
            offset: m_start + t.offset * elem,
            n_bytes: n * elem,
        });
    }
    Ok((tensors, skipped))
}

/// The `(name, tensor)` entries of a state dict: the pickle's dict itself, or the dict
/// under its `state_dict` / `model` / `module` key (training checkpoints wrap it so).
/// Entries that are not tensors (counters, nested metadata) are left out.
fn state_dict(v: Value) -> Option<Vec<(String, TensorRef)>> {
    let Value::Dict(entries) = v else {
        return None;
    };
    let tensors: Vec<(String, TensorRef)> = entries
        .iter()
        .filter_map(|(k, v)| match (k, v) {
            (Value::Str(k), Value::Tensor(t)) => Some((k.clone(), t.clone())),
            _ => None,
        })
        .collect();
    if !tensors.is_empty() {
        return Some(tensors);
    }
    entries.into_iter().find_map(|(k, v)| match k {
        Value::Str(k) if matches!(k.as_str(), "state_dict" | "model" | "module") => state_dict(v),
        _ => None,
    })
}
