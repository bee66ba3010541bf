//! What a conversion reads: a GGUF or `.mica` file (metadata and tensors as stored), or a
//! Hugging Face folder seen as the GGUF file llama.cpp's converter would write from it
//! (see [`super::hf`]). Either way the converter gets GGUF metadata, GGUF tensor names and
//! shapes, and each tensor's bytes in its stored type.

use super::hf::HfSource;
use crate::error::Result;
use crate::progress::Event;
use mica_formats::{Container, GgufFile, MetaValue, TensorInfo};
use std::borrow::Cow;
use std::path::Path;

/// An open conversion source.
pub enum Source {
    File(GgufFile),
    Hf(Box<HfSource>),
}

impl Source {
    /// Opens a file, or a folder; a folder's warnings go to `on_event`.
    pub fn open(path: &Path, on_event: &mut dyn FnMut(Event)) -> Result<Source> {
        if path.is_dir() {
            return Ok(Source::Hf(Box::new(HfSource::open(path, on_event)?)));
        }
        Ok(Source::File(GgufFile::open(path)?))
    }

    /// The GGUF metadata (key, value) in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        match self {
            Source::File(f) => f.metadata_entries(),
            Source::Hf(h) => &h.metadata,
        }
    }

    pub fn meta(&self, key: &str) -> Option<&MetaValue> {
        self.metadata().iter().find(|(k, _)| k == key).map(|e| &e.1)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.meta(key).and_then(MetaValue::as_str)
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.meta(key).and_then(MetaValue::as_u64)
    }

    /// Every tensor, GGUF names and shapes (innermost first).
    pub fn tensors(&self) -> &[TensorInfo] {
        match self {
            Source::File(f) => f.tensors(),
            Source::Hf(h) => h.tensors(),
        }
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensors().iter().any(|t| t.name == name)
    }

    /// The bytes of tensor `i` of [`Source::tensors`], in its stored type and GGUF layout.
    pub fn data(&self, i: usize) -> Result<Cow<'_, [u8]>> {
        match self {
            Source::File(f) => Ok(Cow::Borrowed(f.tensor_data(&f.tensors()[i]))),
            Source::Hf(h) => h.data(i),
        }
    }

    /// `gguf`, `mica` or `hf` (for the provenance).
    pub fn format_name(&self) -> &'static str {
        match self {
            Source::File(f) => match f.container() {
                Container::Gguf => "gguf",
                Container::Mica => "mica",
            },
            Source::Hf(_) => "hf",
        }
    }

    /// Bytes of the source (all shards for a folder).
    pub fn size(&self) -> u64 {
        match self {
            Source::File(f) => f.file_size(),
            Source::Hf(h) => h.size,
        }
    }
}
