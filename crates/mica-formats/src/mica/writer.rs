//! The streaming `.mica` writer. The key-value sections go first (they are small); tensor
//! data streams in one chunk at a time, each tensor's CRC32C computed on the way; the tensor
//! directory is written after the data, and the header, which holds every section's place
//! and checksum, is written last over a zeroed placeholder. Everything goes through an
//! [`AtomicFile`], so the target path holds either nothing or a complete file.

use super::{
    ALIGNMENT, FIXED_HEADER, MICA_MAGIC, SECTION_ENTRY, Section, SectionKind, VERSION_MAJOR,
    VERSION_MINOR, header_size, section_of_key,
};
use crate::atomic::AtomicFile;
use crate::error::{FormatError, Result};
use crate::ggml_types::GgmlType;
use crate::gguf::MetaValue;
use crate::gguf::writer::{put_kv_list, put_str};
use crate::sink::TensorSink;
use std::path::Path;

/// Sections every file written here has, in file order (the directory comes last).
const KV_SECTIONS: [SectionKind; 5] = [
    SectionKind::Config,
    SectionKind::Tokenizer,
    SectionKind::ChatTemplate,
    SectionKind::Metadata,
    SectionKind::Provenance,
];
const N_SECTIONS: usize = KV_SECTIONS.len() + 1;

/// A directory entry being collected.
struct DirEntry {
    name: String,
    ggml_type: GgmlType,
    shape: Vec<u64>,
    offset: u64,
    size: u64,
    crc: u32,
}

/// The tensor being streamed.
struct Current {
    entry: DirEntry,
    /// Bytes still expected.
    left: u64,
}

/// Writes a `.mica` file tensor by tensor; see the module docs.
pub struct MicaWriter {
    file: AtomicFile,
    sections: Vec<Section>,
    dir: Vec<DirEntry>,
    current: Option<Current>,
    /// Bytes written so far (the file position).
    pos: u64,
    /// Set by the first failed call: such a file is never finished.
    poisoned: bool,
}

impl MicaWriter {
    /// Starts a file at a temporary path beside `target`. `metadata` is the model's
    /// key-value metadata in GGUF's naming (split here into the config, tokenizer, chat
    /// template and metadata sections); `provenance` describes how the file was made.
    /// `general.alignment` is dropped: alignment is a property of the container.
    pub fn create(
        target: &Path,
        metadata: &[(String, MetaValue)],
        provenance: &[(String, MetaValue)],
    ) -> Result<MicaWriter> {
        let arch = metadata
            .iter()
            .find(|(k, _)| k == "general.architecture")
            .and_then(|(_, v)| v.as_str())
            .map(str::to_string);
        let mut parts: [Vec<(String, MetaValue)>; 4] = Default::default();
        for (k, v) in metadata {
            if k == "general.alignment" {
                continue;
            }
            let i = match section_of_key(k, arch.as_deref()) {
                SectionKind::Config => 0,
                SectionKind::Tokenizer => 1,
                SectionKind::ChatTemplate => 2,
                _ => 3,
            };
            parts[i].push((k.clone(), v.clone()));
        }
        let mut file = AtomicFile::create(target)?;
        let hsize = header_size(N_SECTIONS) as u64;
        file.write_zeros(hsize)?;
        let mut w = MicaWriter {
            file,
            sections: Vec::with_capacity(N_SECTIONS),
            dir: Vec::new(),
            current: None,
            pos: hsize,
            poisoned: false,
        };
        let provenance = provenance.to_vec();
        for (kind, entries) in KV_SECTIONS
            .iter()
            .zip(parts.iter().chain(std::iter::once(&provenance)))
        {
            let mut bytes = Vec::new();
            put_kv_list(&mut bytes, entries);
            w.write_section(*kind, &bytes)?;
        }
        Ok(w)
    }

    fn write_section(&mut self, kind: SectionKind, bytes: &[u8]) -> Result<()> {
        // Sections start on 8-byte boundaries (not required by readers; tidy for dumps).
        let pad = self.pos.div_ceil(8) * 8 - self.pos;
        self.file.write_zeros(pad)?;
        self.pos += pad;
        self.sections.push(Section {
            kind,
            offset: self.pos,
            size: bytes.len() as u64,
            crc32c: crc32c::crc32c(bytes),
        });
        self.file.write_all(bytes)?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    fn err(&self, tensor: &str, msg: String) -> FormatError {
        FormatError::Tensor {
            path: self.file.target().to_path_buf(),
            tensor: tensor.to_string(),
            msg,
        }
    }

    fn header(&self, file_size: u64) -> Vec<u8> {
        let mut h = Vec::with_capacity(header_size(self.sections.len()));
        h.extend_from_slice(MICA_MAGIC);
        h.extend_from_slice(&VERSION_MAJOR.to_le_bytes());
        h.extend_from_slice(&VERSION_MINOR.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes()); // required flags
        h.extend_from_slice(&0u32.to_le_bytes()); // optional flags
        h.extend_from_slice(&(self.sections.len() as u32).to_le_bytes());
        h.extend_from_slice(&(ALIGNMENT as u32).to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes()); // reserved
        h.extend_from_slice(&file_size.to_le_bytes());
        debug_assert_eq!(h.len(), FIXED_HEADER);
        for s in &self.sections {
            h.extend_from_slice(&s.kind.id().to_le_bytes());
            h.extend_from_slice(&0u32.to_le_bytes());
            h.extend_from_slice(&s.offset.to_le_bytes());
            h.extend_from_slice(&s.size.to_le_bytes());
            h.extend_from_slice(&s.crc32c.to_le_bytes());
            h.extend_from_slice(&0u32.to_le_bytes());
        }
        debug_assert_eq!(h.len(), FIXED_HEADER + SECTION_ENTRY * self.sections.len());
        let crc = crc32c::crc32c(&h);
        h.extend_from_slice(&crc.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h
    }

    /// Writes a whole tensor at once.
    pub fn add_tensor(
        &mut self,
        name: &str,
        ggml_type: GgmlType,
        shape: &[u64],
        data: &[u8],
    ) -> Result<()> {
        self.begin_tensor(name, ggml_type, shape)?;
        self.write_data(data)?;
        self.end_tensor()
    }
}

impl MicaWriter {
    fn begin_inner(&mut self, name: &str, ggml_type: GgmlType, shape: &[u64]) -> Result<()> {
        if let Some(c) = &self.current {
            return Err(self.err(&c.entry.name, "was not ended before the next tensor".into()));
        }
        if self.dir.iter().any(|d| d.name == name) {
            return Err(self.err(name, "written twice".into()));
        }
        if shape.is_empty() || shape.len() > 4 {
            return Err(self.err(name, format!("rank {} (must be 1 to 4)", shape.len())));
        }
        let size = ggml_type.n_bytes(shape).ok_or_else(|| {
            self.err(
                name,
                format!("shape {shape:?} does not fit type {}", ggml_type.name()),
            )
        })?;
        let pad = self.pos.div_ceil(ALIGNMENT) * ALIGNMENT - self.pos;
        self.file.write_zeros(pad)?;
        self.pos += pad;
        self.current = Some(Current {
            entry: DirEntry {
                name: name.to_string(),
                ggml_type,
                shape: shape.to_vec(),
                offset: self.pos,
                size,
                crc: 0,
            },
            left: size,
        });
        Ok(())
    }

    fn write_inner(&mut self, bytes: &[u8]) -> Result<()> {
        let Some(c) = self.current.as_mut() else {
            return Err(self.err("?", "data written outside a tensor".into()));
        };
        if bytes.len() as u64 > c.left {
            let (name, size) = (c.entry.name.clone(), c.entry.size);
            return Err(self.err(&name, format!("more data than its {size} bytes")));
        }
        c.left -= bytes.len() as u64;
        c.entry.crc = crc32c::crc32c_append(c.entry.crc, bytes);
        self.file.write_all(bytes)?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    fn end_inner(&mut self) -> Result<()> {
        match self.current.take() {
            Some(c) if c.left == 0 => {
                self.dir.push(c.entry);
                Ok(())
            }
            Some(c) => Err(self.err(
                &c.entry.name,
                format!(
                    "ended with {} of its {} bytes missing",
                    c.left, c.entry.size
                ),
            )),
            None => Err(self.err("?", "no tensor was begun".into())),
        }
    }

    /// Records a failure so that the file cannot be finished.
    fn poison<T>(&mut self, r: Result<T>) -> Result<T> {
        if r.is_err() {
            self.poisoned = true;
        }
        r
    }
}

impl TensorSink for MicaWriter {
    fn begin_tensor(&mut self, name: &str, ggml_type: GgmlType, shape: &[u64]) -> Result<()> {
        let r = self.begin_inner(name, ggml_type, shape);
        self.poison(r)
    }

    fn write_data(&mut self, bytes: &[u8]) -> Result<()> {
        let r = self.write_inner(bytes);
        self.poison(r)
    }

    fn end_tensor(&mut self) -> Result<()> {
        let r = self.end_inner();
        self.poison(r)
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        if self.poisoned {
            return Err(FormatError::Io {
                path: self.file.target().to_path_buf(),
                cause: std::io::Error::other("an earlier write failed; the file was not finished"),
            });
        }
        if let Some(c) = &self.current {
            return Err(self.err(&c.entry.name, "the file was finished mid-tensor".into()));
        }
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&(self.dir.len() as u64).to_le_bytes());
        for d in &self.dir {
            put_str(&mut bytes, &d.name);
            bytes.extend_from_slice(&d.ggml_type.0.to_le_bytes());
            bytes.extend_from_slice(&(d.shape.len() as u32).to_le_bytes());
            for x in &d.shape {
                bytes.extend_from_slice(&x.to_le_bytes());
            }
            bytes.extend_from_slice(&d.offset.to_le_bytes());
            bytes.extend_from_slice(&d.size.to_le_bytes());
            bytes.extend_from_slice(&d.crc.to_le_bytes());
        }
        self.write_section(SectionKind::TensorDirectory, &bytes)?;
        let header = self.header(self.pos);
        self.file.patch(0, &header)?;
        let MicaWriter { file, .. } = *self;
        file.commit()
    }

    fn bytes_written(&self) -> u64 {
        self.pos
    }
}
