//! `.mica` v1: mica's own model file format (specified in `docs/format.md`).
//!
//! ```text
//! header   magic "\x89MICA\r\n\x1a" | major u16 | minor u16 | required_flags u32 |
//!          optional_flags u32 | n_sections u32 | alignment u32 | reserved u32 | file_size u64
//!          n_sections × (kind u32, reserved u32, offset u64, size u64, crc32c u32, reserved u32)
//!          header_crc32c u32 (of every header byte before it) | reserved u32
//! sections config, tokenizer, chat template, metadata, provenance: key-value lists in GGUF's
//!          value encoding; tensor directory: name, dtype, shape, offset, size, crc32c
//! data     each tensor at a multiple of 4096 bytes, zero padding between
//! ```
//! Opening validates the header checksum, the file size, every section's checksum and range
//! and every tensor's dtype, shape and byte range: cheap (the sections are small) and enough
//! that nothing later reads out of bounds. Tensor data is checked on demand
//! ([`MicaFile::verify_tensor`]) with hardware CRC32C. The model is then presented through
//! the same [`GgufFile`] view as a GGUF file, so the model code does not know which
//! container it came from.

mod reader;
mod writer;

pub use writer::MicaWriter;

use crate::error::{FormatError, Result};
use crate::gguf::{GgufFile, MetaValue};
use std::path::Path;

/// The first 8 bytes of every `.mica` file. The high byte catches 7-bit transfers, the
/// CR LF pair catches newline conversion, and 0x1a stops `type` on Windows (as PNG's).
pub const MICA_MAGIC: &[u8; 8] = b"\x89MICA\r\n\x1a";
/// The major version this code reads and writes. A reader refuses other majors.
pub const VERSION_MAJOR: u16 = 1;
/// The minor version this code writes. Minor versions only add what old readers may skip.
pub const VERSION_MINOR: u16 = 0;
/// Alignment of every tensor's data, in bytes (a page, and enough for DMA).
pub const ALIGNMENT: u64 = 4096;
/// Bytes of the fixed part of the header, before the section table.
pub const FIXED_HEADER: usize = 40;
/// Bytes of one section table entry.
pub const SECTION_ENTRY: usize = 32;
/// Required flags this reader understands (none are defined in v1.0).
pub const KNOWN_REQUIRED_FLAGS: u32 = 0;

/// Header size for `n` sections: fixed part, table, checksum and its padding.
pub fn header_size(n_sections: usize) -> usize {
    FIXED_HEADER + SECTION_ENTRY * n_sections + 8
}

/// What a section holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SectionKind {
    /// `general.architecture` and the `<arch>.*` hyper-parameters.
    Config,
    /// `tokenizer.*` except the chat template.
    Tokenizer,
    /// `tokenizer.chat_template` and its named variants.
    ChatTemplate,
    /// Every other key of the source (name, license, quantization version...).
    Metadata,
    /// How the file was made: source, converter, recipe. Not part of the model's metadata.
    Provenance,
    /// The tensor directory.
    TensorDirectory,
    /// A kind this reader does not know (skipped: see the versioning rules).
    Unknown(u32),
}

impl SectionKind {
    pub fn id(self) -> u32 {
        match self {
            SectionKind::Config => 1,
            SectionKind::Tokenizer => 2,
            SectionKind::ChatTemplate => 3,
            SectionKind::Metadata => 4,
            SectionKind::Provenance => 5,
            SectionKind::TensorDirectory => 6,
            SectionKind::Unknown(id) => id,
        }
    }

    pub fn from_id(id: u32) -> SectionKind {
        match id {
            1 => SectionKind::Config,
            2 => SectionKind::Tokenizer,
            3 => SectionKind::ChatTemplate,
            4 => SectionKind::Metadata,
            5 => SectionKind::Provenance,
            6 => SectionKind::TensorDirectory,
            id => SectionKind::Unknown(id),
        }
    }
}

/// One entry of the section table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Section {
    pub kind: SectionKind,
    pub offset: u64,
    pub size: u64,
    pub crc32c: u32,
}

/// Which key-value section a metadata key belongs in.
pub fn section_of_key(key: &str, arch: Option<&str>) -> SectionKind {
    if key == "general.architecture" {
        return SectionKind::Config;
    }
    if let Some(a) = arch
        && key.len() > a.len()
        && key.starts_with(a)
        && key.as_bytes()[a.len()] == b'.'
    {
        return SectionKind::Config;
    }
    if key == "tokenizer.chat_template" || key.starts_with("tokenizer.chat_template.") {
        return SectionKind::ChatTemplate;
    }
    if key.starts_with("tokenizer.") {
        return SectionKind::Tokenizer;
    }
    SectionKind::Metadata
}

/// An open, validated `.mica` file: the model view plus what only `.mica` has.
pub struct MicaFile {
    view: GgufFile,
    version: (u16, u16),
    required_flags: u32,
    optional_flags: u32,
    sections: Vec<Section>,
    provenance: Vec<(String, MetaValue)>,
    /// CRC32C of each tensor's bytes, in the order of `view.tensors()`.
    crcs: Vec<u32>,
}

impl MicaFile {
    /// Opens, maps and validates a `.mica` file (header, sections, directory; not the data).
    pub fn open(path: impl AsRef<Path>) -> Result<MicaFile> {
        let path = path.as_ref().to_path_buf();
        let io = |cause| FormatError::Io {
            path: path.clone(),
            cause,
        };
        let file = std::fs::File::open(&path).map_err(io)?;
        if file.metadata().map_err(io)?.len() == 0 {
            return Err(FormatError::Parse {
                path,
                offset: 0,
                msg: "file is truncated: it is empty".into(),
            });
        }
        // SAFETY: read-only private map; see `GgufFile::open`.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::from_mmap(path, mmap)
    }

    pub(crate) fn from_mmap(path: std::path::PathBuf, mmap: memmap2::Mmap) -> Result<MicaFile> {
        reader::parse(path, mmap)
    }

    /// The model as a GGUF-shaped view (metadata keys and tensors).
    pub fn view(&self) -> &GgufFile {
        &self.view
    }

    pub fn into_view(self) -> GgufFile {
        self.view
    }

    /// (major, minor).
    pub fn version(&self) -> (u16, u16) {
        self.version
    }

    pub fn flags(&self) -> (u32, u32) {
        (self.required_flags, self.optional_flags)
    }

    pub fn sections(&self) -> &[Section] {
        &self.sections
    }

    /// The provenance section's keys (`mica.*`).
    pub fn provenance(&self) -> &[(String, MetaValue)] {
        &self.provenance
    }

    /// The stored CRC32C of tensor `i` (in `view().tensors()` order).
    pub fn tensor_crc(&self, i: usize) -> Option<u32> {
        self.crcs.get(i).copied()
    }

    /// Recomputes tensor `i`'s CRC32C and compares it with the directory's.
    pub fn verify_tensor(&self, i: usize) -> Result<()> {
        let (Some(info), Some(&want)) = (self.view.tensors().get(i), self.crcs.get(i)) else {
            return Err(FormatError::Parse {
                path: self.view.path().to_path_buf(),
                offset: 0,
                msg: format!("no tensor number {i}"),
            });
        };
        let got = crc32c::crc32c(self.view.tensor_data(info));
        if got != want {
            return Err(self.view.tensor_error(
                &info.name,
                format!(
                    "data is corrupt: CRC32C of its {} bytes at offset {} is {got:08x}, \
                     the directory says {want:08x}",
                    info.n_bytes, info.offset
                ),
            ));
        }
        Ok(())
    }
}

impl std::fmt::Debug for MicaFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MicaFile")
            .field("view", &self.view)
            .field("version", &self.version)
            .field("sections", &self.sections.len())
            .finish()
    }
}
