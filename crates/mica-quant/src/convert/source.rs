//! What a conversion reads: a GGUF or `.mica` file (metadata and tensors as stored), or a
//! Hugging Face folder seen as the GGUF file llama.cpp's converter would write from it
//! (see [`super::hf`]). Either way the converter gets GGUF metadata, GGUF tensor names and
//! shapes, and each tensor's bytes in its stored type — or, for a tensor replaced in memory
//! (a LoRA adapter merged in), its F32 values.

use super::hf::HfSource;
use crate::error::Result;
use crate::progress::Event;
use mica_formats::ggml_types::GgmlType;
use mica_formats::{Container, GgufFile, MetaValue, TensorInfo};
use mica_kernels::DType;
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

/// Where the tensors come from.
enum Stored {
    File(GgufFile),
    Hf(Box<HfSource>),
}

/// An open conversion source, with any tensors replaced in memory (LoRA merged in).
pub struct Source {
    stored: Stored,
    /// The tensor list when some tensors are replaced (their type changed to F32).
    tensors: Option<Vec<TensorInfo>>,
    /// Replaced tensors: index → F32 bytes (GGUF layout).
    replaced: HashMap<usize, Vec<u8>>,
}

impl Source {
    /// Opens a file, or a folder; a folder's warnings go to `on_event`.
    pub fn open(path: &Path, on_event: &mut dyn FnMut(Event)) -> Result<Source> {
        let stored = if path.is_dir() {
            Stored::Hf(Box::new(HfSource::open(path, on_event)?))
        } else {
            Stored::File(GgufFile::open(path)?)
        };
        Ok(Source {
            stored,
            tensors: None,
            replaced: HashMap::new(),
        })
    }

    /// Replaces tensor `i` by F32 `values` of the same shape (GGUF layout).
    pub fn replace_f32(&mut self, i: usize, values: &[f32]) {
        if self.tensors.is_none() {
            self.tensors = Some(self.stored_tensors().to_vec());
        }
        let t = &mut self.tensors.as_mut().expect("just set")[i];
        assert_eq!(
            t.n_elements(),
            values.len() as u64,
            "{}: replacement size",
            t.name
        );
        t.ggml_type = GgmlType(DType::F32.ggml_id());
        t.n_bytes = 4 * values.len() as u64;
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.replaced.insert(i, bytes);
    }

    /// The GGUF metadata (key, value) in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        match &self.stored {
            Stored::File(f) => f.metadata_entries(),
            Stored::Hf(h) => &h.metadata,
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
        self.tensors
            .as_deref()
            .unwrap_or_else(|| self.stored_tensors())
    }

    fn stored_tensors(&self) -> &[TensorInfo] {
        match &self.stored {
            Stored::File(f) => f.tensors(),
            Stored::Hf(h) => h.tensors(),
        }
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensors().iter().any(|t| t.name == name)
    }

    /// The bytes of tensor `i` of [`Source::tensors`], in its stored type and GGUF layout.
    pub fn data(&self, i: usize) -> Result<Cow<'_, [u8]>> {
        if let Some(b) = self.replaced.get(&i) {
            return Ok(Cow::Borrowed(b));
        }
        match &self.stored {
            Stored::File(f) => Ok(Cow::Borrowed(f.tensor_data(&f.tensors()[i]))),
            Stored::Hf(h) => h.data(i),
        }
    }

    /// Whether the source is a Hugging Face folder.
    pub fn is_hf(&self) -> bool {
        matches!(self.stored, Stored::Hf(_))
    }

    /// `gguf`, `mica` or `hf` (for the provenance).
    pub fn format_name(&self) -> &'static str {
        match &self.stored {
            Stored::File(f) => match f.container() {
                Container::Gguf => "gguf",
                Container::Mica => "mica",
            },
            Stored::Hf(_) => "hf",
        }
    }

    /// Bytes of the source (all shards for a folder).
    pub fn size(&self) -> u64 {
        match &self.stored {
            Stored::File(f) => f.file_size(),
            Stored::Hf(h) => h.size,
        }
    }
}
