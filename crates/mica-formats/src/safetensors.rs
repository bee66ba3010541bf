//! safetensors: the tensor file format of Hugging Face checkpoints (sharded checkpoints are
//! [`crate::checkpoint`]'s).
//!
//! Layout:
//! ```text
//! header_len u64 (little-endian) | header: header_len bytes of UTF-8 JSON | data
//! header = { "__metadata__": {str: str}?, name: {"dtype": "F32", "shape": [d0, d1, ...],
//!            "data_offsets": [begin, end]}, ... }   (offsets relative to the data start)
//! ```
//! Shapes are outermost first (row-major, `[rows, cols]` for a matrix); [`TensorInfo`]
//! stores them innermost first as ggml does, so a `[rows, cols]` matrix becomes
//! `shape = [cols, rows]` exactly like a GGUF matrix. Everything is validated at open: the
//! header length against the file, the JSON, every dtype, shape (overflow-checked) and byte
//! range (inside the data, size matching the shape). Tensor bytes stay in a read-only map.
//!
//! Reference: the safetensors format description in the `safetensors` repository (README,
//! "Format").

use crate::error::{FormatError, Result};
use crate::ggml_types::GgmlType;
use crate::tensor::TensorInfo;
use memmap2::Mmap;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Largest header accepted (the format's own limit is 100 MB).
const MAX_HEADER: u64 = 100 << 20;

/// safetensors dtype names and the ggml type each is read as.
const DTYPES: &[(&str, u32)] = &[
    ("F32", 0),
    ("F16", 1),
    ("BF16", 30),
    ("I8", 24),
    ("I16", 25),
    ("I32", 26),
    ("I64", 27),
    ("F64", 28),
];

/// An open, validated safetensors file.
pub struct SafetensorsFile {
    path: PathBuf,
    mmap: Mmap,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
    metadata: Vec<(String, String)>,
}

impl SafetensorsFile {
    /// Opens, maps and validates a safetensors file.
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        let path = path.as_ref().to_path_buf();
        let io = |cause| FormatError::Io {
            path: path.clone(),
            cause,
        };
        let file = File::open(&path).map_err(io)?;
        // SAFETY: read-only private map; see `GgufFile::open` for the truncation caveat.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        let (tensors, metadata) = parse(&path, &mmap)?;
        let index = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(SafetensorsFile {
            path,
            mmap,
            tensors,
            index,
            metadata,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tensors in header order (the JSON object's order).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// `__metadata__` entries.
    pub fn metadata(&self) -> &[(String, String)] {
        &self.metadata
    }

    /// The whole mapped file.
    pub fn bytes(&self) -> &[u8] {
        &self.mmap
    }

    pub(crate) fn mmap(&self) -> &Mmap {
        &self.mmap
    }

    /// The bytes of one tensor (validated at open).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        &self.mmap[t.offset as usize..(t.offset + t.n_bytes) as usize]
    }
}

type Parsed = (Vec<TensorInfo>, Vec<(String, String)>);

fn parse(path: &Path, bytes: &[u8]) -> Result<Parsed> {
    let err = |offset: u64, msg: String| FormatError::Parse {
        path: path.to_path_buf(),
        offset,
        msg,
    };
    if bytes.len() < 8 {
        return Err(err(
            0,
            format!(
                "file of {} bytes is too short for a safetensors header",
                bytes.len()
            ),
        ));
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    let avail = bytes.len() as u64 - 8;
    if n > avail || n > MAX_HEADER {
        return Err(err(
            0,
            format!(
                "header length {n} is larger than the {avail} bytes after it (or the 100 MB limit): not a safetensors file, or truncated"
            ),
        ));
    }
    let data_start = 8 + n;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..data_start as usize])
        .map_err(|e| err(8, format!("header is not valid JSON: {e}")))?;
    let obj = header
        .as_object()
        .ok_or_else(|| err(8, "header is not a JSON object".into()))?;
    let data_len = avail - n;
    let mut tensors = Vec::with_capacity(obj.len());
    let mut metadata = Vec::new();
    for (name, v) in obj {
        if name == "__metadata__" {
            if let Some(m) = v.as_object() {
                for (k, v) in m {
                    metadata.push((k.clone(), v.as_str().unwrap_or_default().to_string()));
                }
            }
            continue;
        }
        let terr = |msg: String| FormatError::Tensor {
            path: path.to_path_buf(),
            tensor: name.clone(),
            msg,
        };
        let dtype = v["dtype"]
            .as_str()
            .ok_or_else(|| terr("no \"dtype\" string".into()))?;
        let ggml = DTYPES
            .iter()
            .find(|(d, _)| *d == dtype)
            .map(|&(_, id)| GgmlType(id))
            .ok_or_else(|| {
                terr(format!(
                    "dtype {dtype} is not supported (supported: {})",
                    DTYPES.iter().map(|d| d.0).collect::<Vec<_>>().join(", ")
                ))
            })?;
        let shape: Vec<u64> = v["shape"]
            .as_array()
            .ok_or_else(|| terr("no \"shape\" array".into()))?
            .iter()
            .map(|d| d.as_u64().ok_or_else(|| terr(format!("bad dimension {d}"))))
            .collect::<Result<_>>()?;
        let offs = v["data_offsets"]
            .as_array()
            .filter(|a| a.len() == 2)
            .ok_or_else(|| terr("no \"data_offsets\" pair".into()))?;
        let (begin, end) = match (offs[0].as_u64(), offs[1].as_u64()) {
            (Some(b), Some(e)) if b <= e => (b, e),
            _ => return Err(terr(format!("bad data_offsets {offs:?}"))),
        };
        if end > data_len {
            return Err(terr(format!(
                "data [{begin}, {end}) runs past the end of the data ({data_len} bytes): file truncated?"
            )));
        }
        let (_, elem) = ggml.geometry().expect("listed dtypes have a geometry");
        let n_elem = shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| terr(format!("shape {shape:?} overflows")))?;
        if n_elem.checked_mul(elem) != Some(end - begin) {
            return Err(terr(format!(
                "shape {shape:?} of {dtype} needs {} bytes but data_offsets give {}",
                n_elem.saturating_mul(elem),
                end - begin
            )));
        }
        tensors.push(TensorInfo {
            name: name.clone(),
            ggml_type: ggml,
            // Innermost first, as ggml orders dimensions.
            shape: shape.iter().rev().copied().collect(),
            offset: data_start + begin,
            n_bytes: end - begin,
        });
    }
    Ok((tensors, metadata))
}
