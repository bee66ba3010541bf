//! GGUF (v2 and v3, little-endian): the file format of llama.cpp.
//!
//! Layout (all integers little-endian):
//! ```text
//! "GGUF" | version u32 | n_tensors u64 | n_kv u64
//! n_kv × (key: string, value_type u32, value)
//! n_tensors × (name: string, n_dims u32, dims u64 × n_dims, ggml_type u32, offset u64)
//! padding to `general.alignment` (default 32)
//! tensor data; each tensor at data_start + offset, offset a multiple of the alignment
//! string = len u64 + bytes (no terminator)
//! ```
//! Everything is validated before use: magic, version, every count and length against the
//! bytes left in the file, every tensor's shape (overflow-checked) and byte range, duplicate
//! keys and names, the alignment. A failure is a [`FormatError`] naming the file and the
//! byte offset or tensor; the reader never panics on file contents.

mod file_type;
mod metadata;
pub(crate) mod reader;
pub mod stream;
pub mod writer;

pub use file_type::file_type_name;
pub use metadata::{MetaArray, MetaValue};
pub use stream::{GgufStreamWriter, TensorDecl};
pub use writer::GgufWriter;

use crate::error::{FormatError, Result};
use crate::tensor::TensorInfo;
use memmap2::Mmap;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// The magic bytes at the start of every GGUF file.
pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// Tensor data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// The container a [`GgufFile`] view was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Container {
    Gguf,
    /// mica's own format (`docs/format.md`); its sections are presented as GGUF metadata.
    Mica,
}

/// An open, validated model file: GGUF, or a `.mica` file presented through the same view
/// (its config, tokenizer, chat template and metadata sections as GGUF key-values, its
/// tensor directory as [`TensorInfo`]s). Tensor data is borrowed from the memory map.
pub struct GgufFile {
    path: PathBuf,
    mmap: Mmap,
    container: Container,
    version: u32,
    /// Metadata in file order.
    metadata: Vec<(String, MetaValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl GgufFile {
    /// Opens, maps and validates a GGUF file, or a `.mica` file (chosen by the magic bytes;
    /// see [`crate::mica::MicaFile`] for the `.mica`-only parts: checksums, provenance).
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref().to_path_buf();
        let io = |cause| FormatError::Io {
            path: path.clone(),
            cause,
        };
        let file = File::open(&path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            return Err(FormatError::Parse {
                path,
                offset: 0,
                msg: "file is empty".into(),
            });
        }
        // SAFETY: the map is read-only and private to this process. If another process
        // truncates the file while mapped, reads may fault; that is inherent to mmap and the
        // same contract every mmap-based model loader has.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        if mmap.starts_with(crate::mica::MICA_MAGIC) {
            return Ok(crate::mica::MicaFile::from_mmap(path, mmap)?.into_view());
        }
        Self::from_mmap(path, mmap)
    }

    fn from_mmap(path: PathBuf, mmap: Mmap) -> Result<GgufFile> {
        let parsed = reader::parse(&path, &mmap)?;
        Ok(Self::from_parts(
            path,
            mmap,
            Container::Gguf,
            parsed.version,
            parsed.metadata,
            parsed.tensors,
            parsed.alignment,
            parsed.data_offset,
        ))
    }

    /// A view over already-validated parts (every tensor range inside `mmap`).
    pub(crate) fn from_parts(
        path: PathBuf,
        mmap: Mmap,
        container: Container,
        version: u32,
        metadata: Vec<(String, MetaValue)>,
        tensors: Vec<TensorInfo>,
        alignment: u64,
        data_offset: u64,
    ) -> GgufFile {
        let meta_index = metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        let tensor_index = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        GgufFile {
            path,
            mmap,
            container,
            version,
            metadata,
            meta_index,
            tensors,
            tensor_index,
            alignment,
            data_offset,
        }
    }

    /// Which container the file is.
    pub fn container(&self) -> Container {
        self.container
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Byte offset where tensor data begins.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the file in bytes.
    pub fn file_size(&self) -> u64 {
        self.mmap.len() as u64
    }

    /// All metadata, in file order.
    pub fn metadata_entries(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// Forgets the metadata entries named in `keys` (those present), freeing their parsed
    /// values: a loader that has consumed a large array (a 150k-token vocabulary and its
    /// merges take ~15 MB parsed) need not keep it for the life of the mapped file.
    pub fn drop_metadata(&mut self, keys: &[&str]) {
        self.metadata.retain(|(k, _)| !keys.contains(&k.as_str()));
        self.metadata.shrink_to_fit();
        self.reindex_metadata();
    }

    /// Removes the metadata entry `key` and hands its value over, if present: a loader that
    /// needs a large array for itself (a 262k-token vocabulary is ~16 MB parsed, in as many
    /// small strings) moves it out instead of copying it.
    pub fn take_metadata(&mut self, key: &str) -> Option<MetaValue> {
        let i = *self.meta_index.get(key)?;
        let (_, value) = self.metadata.remove(i);
        self.reindex_metadata();
        Some(value)
    }

    fn reindex_metadata(&mut self) {
        self.meta_index = (self.metadata.iter().enumerate())
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
    }

    pub fn metadata(&self, key: &str) -> Option<&MetaValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.metadata(key).and_then(MetaValue::as_str)
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.metadata(key).and_then(MetaValue::as_u64)
    }

    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get_u64(key).and_then(|v| u32::try_from(v).ok())
    }

    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.metadata(key)
            .and_then(MetaValue::as_f64)
            .map(|v| v as f32)
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.metadata(key).and_then(MetaValue::as_bool)
    }

    pub fn get_array(&self, key: &str) -> Option<&MetaArray> {
        self.metadata(key).and_then(MetaValue::as_array)
    }

    pub fn get_str_array(&self, key: &str) -> Option<&[String]> {
        self.get_array(key).and_then(MetaArray::as_strings)
    }

    /// A typed error for a key that is present but has the wrong type or value, for callers
    /// turning metadata into configuration.
    pub fn metadata_error(&self, key: &str, msg: impl Into<String>) -> FormatError {
        FormatError::Metadata {
            path: self.path.clone(),
            key: key.to_string(),
            msg: msg.into(),
        }
    }

    /// A typed error about a tensor, for callers.
    pub fn tensor_error(&self, tensor: &str, msg: impl Into<String>) -> FormatError {
        FormatError::Tensor {
            path: self.path.clone(),
            tensor: tensor.to_string(),
            msg: msg.into(),
        }
    }

    /// All tensors, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor, straight from the memory map. Ranges were validated at open.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = info.offset as usize;
        &self.mmap[start..start + info.n_bytes as usize]
    }

    /// The whole mapped file.
    pub fn bytes(&self) -> &[u8] {
        &self.mmap
    }

    pub(crate) fn mmap(&self) -> &Mmap {
        &self.mmap
    }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}
