//! Parsing and validating a mapped `.mica` file. Everything the header and directory say is
//! checked against the file before any of it is used; a failure names the file and the byte
//! offset, section or tensor.

use super::{
    ALIGNMENT, FIXED_HEADER, KNOWN_REQUIRED_FLAGS, MICA_MAGIC, MicaFile, SECTION_ENTRY, Section,
    SectionKind, VERSION_MAJOR, header_size,
};
use crate::error::{FormatError, Result};
use crate::ggml_types::GgmlType;
use crate::gguf::reader::{Cursor, read_kv_list};
use crate::gguf::{Container, GgufFile, MetaValue};
use crate::tensor::TensorInfo;
use memmap2::Mmap;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// More sections than this is a corrupt count, not a file.
const MAX_SECTIONS: usize = 1024;
/// ggml's limit on tensor rank.
const MAX_DIMS: u32 = 4;

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn perr(path: &Path, offset: u64, msg: impl Into<String>) -> FormatError {
    FormatError::Parse {
        path: path.to_path_buf(),
        offset,
        msg: msg.into(),
    }
}

/// Header fields, validated.
struct Header {
    version: (u16, u16),
    required_flags: u32,
    optional_flags: u32,
    sections: Vec<Section>,
    header_size: u64,
}

fn parse_header(path: &Path, b: &[u8]) -> Result<Header> {
    let len = b.len() as u64;
    if b.len() < FIXED_HEADER + 8 {
        return Err(perr(
            path,
            len,
            format!("file is truncated: {len} bytes, shorter than a .mica header"),
        ));
    }
    if &b[..8] != MICA_MAGIC {
        return Err(perr(path, 0, "not a .mica file: bad magic bytes"));
    }
    let version = (le_u16(b, 8), le_u16(b, 10));
    if version.0 != VERSION_MAJOR {
        return Err(perr(
            path,
            8,
            format!(
                ".mica version {}.{} is not supported (this mica reads {VERSION_MAJOR}.x)",
                version.0, version.1
            ),
        ));
    }
    let n_sections = le_u32(b, 20) as usize;
    if n_sections > MAX_SECTIONS {
        return Err(perr(
            path,
            20,
            format!("section count {n_sections} is absurd: the header is corrupt"),
        ));
    }
    let hsize = header_size(n_sections);
    if hsize > b.len() {
        return Err(perr(
            path,
            len,
            format!("file is truncated: the header needs {hsize} bytes, the file has {len}"),
        ));
    }
    let crc_at = hsize - 8;
    let stored = le_u32(b, crc_at);
    let computed = crc32c::crc32c(&b[..crc_at]);
    if stored != computed {
        return Err(perr(
            path,
            crc_at as u64,
            format!(
                "header checksum mismatch (stored {stored:08x}, computed {computed:08x}): \
                 the header is corrupt"
            ),
        ));
    }
    let required_flags = le_u32(b, 12);
    let unknown = required_flags & !KNOWN_REQUIRED_FLAGS;
    if unknown != 0 {
        return Err(perr(
            path,
            12,
            format!(
                "the file sets required flags {unknown:#x} that this mica does not know; \
                 it needs a newer reader"
            ),
        ));
    }
    let optional_flags = le_u32(b, 16);
    let alignment = le_u32(b, 24) as u64;
    if alignment != ALIGNMENT {
        return Err(perr(
            path,
            24,
            format!("alignment is {alignment}, .mica v1 requires {ALIGNMENT}"),
        ));
    }
    let file_size = le_u64(b, 32);
    if file_size != len {
        let what = if len < file_size {
            "file is truncated"
        } else {
            "file has trailing bytes"
        };
        return Err(perr(
            path,
            len.min(file_size),
            format!("{what}: the header says {file_size} bytes, the file has {len}"),
        ));
    }
    let mut sections = Vec::with_capacity(n_sections);
    for i in 0..n_sections {
        let at = FIXED_HEADER + i * SECTION_ENTRY;
        let s = Section {
            kind: SectionKind::from_id(le_u32(b, at)),
            offset: le_u64(b, at + 8),
            size: le_u64(b, at + 16),
            crc32c: le_u32(b, at + 24),
        };
        let end = s.offset.checked_add(s.size);
        if s.offset < hsize as u64 || end.is_none_or(|e| e > len) {
            return Err(perr(
                path,
                at as u64,
                format!(
                    "section {i} ({:?}) range {}..+{} lies outside the file",
                    s.kind, s.offset, s.size
                ),
            ));
        }
        if !matches!(s.kind, SectionKind::Unknown(_))
            && sections.iter().any(|o: &Section| o.kind == s.kind)
        {
            return Err(perr(
                path,
                at as u64,
                format!("section {:?} appears twice", s.kind),
            ));
        }
        let bytes = &b[s.offset as usize..(s.offset + s.size) as usize];
        let got = crc32c::crc32c(bytes);
        if got != s.crc32c {
            return Err(perr(
                path,
                s.offset,
                format!(
                    "section {:?} is corrupt: CRC32C {got:08x}, the header says {:08x}",
                    s.kind, s.crc32c
                ),
            ));
        }
        sections.push(s);
    }
    Ok(Header {
        version,
        required_flags,
        optional_flags,
        sections,
        header_size: hsize as u64,
    })
}

fn section_bytes<'a>(b: &'a [u8], s: &Section) -> &'a [u8] {
    &b[s.offset as usize..(s.offset + s.size) as usize]
}

fn parse_kv_section(path: &Path, b: &[u8], s: &Section) -> Result<Vec<(String, MetaValue)>> {
    let mut c = Cursor {
        path,
        buf: section_bytes(b, s),
        pos: 0,
        base: s.offset,
    };
    let kv = read_kv_list(&mut c)?;
    if c.remaining() != 0 {
        return Err(c.err(
            c.pos,
            format!(
                "{} unread bytes at the end of section {:?}",
                c.remaining(),
                s.kind
            ),
        ));
    }
    Ok(kv)
}

/// One directory entry before range checks.
struct RawEntry {
    name: String,
    ggml_type: GgmlType,
    shape: Vec<u64>,
    offset: u64,
    size: u64,
    crc: u32,
}

fn parse_directory(path: &Path, b: &[u8], s: &Section) -> Result<Vec<RawEntry>> {
    let mut c = Cursor {
        path,
        buf: section_bytes(b, s),
        pos: 0,
        base: s.offset,
    };
    // name len 8 + dtype 4 + rank 4 + one dim 8 + offset 8 + size 8 + crc 4
    let n = c.count("tensor count", 44)?;
    let mut out = Vec::with_capacity(n);
    let mut names = HashSet::with_capacity(n);
    for i in 0..n {
        let at = c.pos;
        let name = c.string(&format!("name of tensor {i}"))?;
        if !names.insert(name.clone()) {
            return Err(c.err(at, format!("duplicate tensor name '{name}'")));
        }
        let ggml_type = GgmlType(c.u32(&format!("dtype of '{name}'"))?);
        let rank = c.u32(&format!("rank of '{name}'"))?;
        if rank == 0 || rank > MAX_DIMS {
            return Err(c.err(
                at,
                format!("tensor '{name}' has {rank} dimensions (must be 1 to {MAX_DIMS})"),
            ));
        }
        let mut shape = Vec::with_capacity(rank as usize);
        for _ in 0..rank {
            shape.push(c.u64(&format!("shape of '{name}'"))?);
        }
        let offset = c.u64(&format!("offset of '{name}'"))?;
        let size = c.u64(&format!("size of '{name}'"))?;
        let crc = c.u32(&format!("checksum of '{name}'"))?;
        out.push(RawEntry {
            name,
            ggml_type,
            shape,
            offset,
            size,
            crc,
        });
    }
    if c.remaining() != 0 {
        return Err(c.err(
            c.pos,
            format!(
                "{} unread bytes at the end of the tensor directory",
                c.remaining()
            ),
        ));
    }
    Ok(out)
}

/// Checks each tensor's dtype, shape and range, and that no two byte ranges overlap (each
/// other or a section).
fn check_tensors(
    path: &Path,
    raw: Vec<RawEntry>,
    sections: &[Section],
    header_size: u64,
    len: u64,
) -> Result<(Vec<TensorInfo>, Vec<u32>)> {
    let mut tensors = Vec::with_capacity(raw.len());
    let mut crcs = Vec::with_capacity(raw.len());
    for e in raw {
        let terr = |msg: String| FormatError::Tensor {
            path: path.to_path_buf(),
            tensor: e.name.clone(),
            msg,
        };
        if e.ggml_type.geometry().is_none() {
            return Err(terr(format!(
                "unknown dtype id {}: the file needs a newer mica",
                e.ggml_type.0
            )));
        }
        let want = e.ggml_type.n_bytes(&e.shape).ok_or_else(|| {
            terr(format!(
                "shape {:?} does not fit {} (row length not a whole number of blocks, or overflow)",
                e.shape,
                e.ggml_type.name()
            ))
        })?;
        if want != e.size {
            return Err(terr(format!(
                "size is {} bytes, its {} shape {:?} needs {want}",
                e.size,
                e.ggml_type.name(),
                e.shape
            )));
        }
        if e.offset % ALIGNMENT != 0 {
            return Err(terr(format!(
                "offset {} is not a multiple of {ALIGNMENT}",
                e.offset
            )));
        }
        if e.offset < header_size || e.offset.checked_add(e.size).is_none_or(|end| end > len) {
            return Err(terr(format!(
                "data range {}..+{} lies outside the file ({len} bytes): truncated or corrupt",
                e.offset, e.size
            )));
        }
        tensors.push(TensorInfo {
            name: e.name,
            ggml_type: e.ggml_type,
            shape: e.shape,
            offset: e.offset,
            n_bytes: e.size,
        });
        crcs.push(e.crc);
    }
    // Overlaps: sort every range (tensors and sections) by start.
    let mut ranges: Vec<(u64, u64, String)> = tensors
        .iter()
        .filter(|t| t.n_bytes > 0)
        .map(|t| {
            (
                t.offset,
                t.offset + t.n_bytes,
                format!("tensor '{}'", t.name),
            )
        })
        .chain(
            sections
                .iter()
                .filter(|s| s.size > 0)
                .map(|s| (s.offset, s.offset + s.size, format!("section {:?}", s.kind))),
        )
        .collect();
    ranges.sort();
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(perr(
                path,
                w[1].0,
                format!("{} overlaps {}: the file is corrupt", w[1].2, w[0].2),
            ));
        }
    }
    Ok((tensors, crcs))
}

pub(super) fn parse(path: PathBuf, mmap: Mmap) -> Result<MicaFile> {
    let b: &[u8] = &mmap;
    let header = parse_header(&path, b)?;
    let find = |k: SectionKind| header.sections.iter().find(|s| s.kind == k);
    let mut metadata = Vec::new();
    for kind in [
        SectionKind::Config,
        SectionKind::Tokenizer,
        SectionKind::ChatTemplate,
        SectionKind::Metadata,
    ] {
        if let Some(s) = find(kind) {
            metadata.extend(parse_kv_section(&path, b, s)?);
        }
    }
    let mut seen = HashSet::with_capacity(metadata.len());
    for (k, _) in &metadata {
        if !seen.insert(k.as_str()) {
            return Err(FormatError::Metadata {
                path: path.clone(),
                key: k.clone(),
                msg: "appears in two sections".into(),
            });
        }
    }
    let provenance = match find(SectionKind::Provenance) {
        Some(s) => parse_kv_section(&path, b, s)?,
        None => Vec::new(),
    };
    let dir = find(SectionKind::TensorDirectory)
        .ok_or_else(|| perr(&path, 20, "the file has no tensor directory section"))?;
    let raw = parse_directory(&path, b, dir)?;
    let (tensors, crcs) = check_tensors(
        &path,
        raw,
        &header.sections,
        header.header_size,
        b.len() as u64,
    )?;
    let data_offset = tensors.iter().map(|t| t.offset).min().unwrap_or(0);
    let view = GgufFile::from_parts(
        path,
        mmap,
        Container::Mica,
        header.version.0 as u32,
        metadata,
        tensors,
        ALIGNMENT,
        data_offset,
    );
    Ok(MicaFile {
        view,
        version: header.version,
        required_flags: header.required_flags,
        optional_flags: header.optional_flags,
        sections: header.sections,
        provenance,
        crcs,
    })
}
