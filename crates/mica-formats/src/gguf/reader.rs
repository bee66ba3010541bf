//! The GGUF parser: a bounds-checked cursor over the mapped bytes.

use super::metadata::{MetaArray, MetaValue, type_id};
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::error::{FormatError, Result};
use crate::ggml_types::GgmlType;
use crate::tensor::TensorInfo;
use std::collections::HashSet;
use std::path::Path;

/// ggml's limit on tensor rank.
const MAX_DIMS: u32 = 4;
/// Arrays nested deeper than this are refused (no real file nests more than 2).
const MAX_ARRAY_DEPTH: u32 = 8;

pub(super) struct Parsed {
    pub version: u32,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
}

/// A bounds-checked reader over `buf`, which starts at byte `base` of the file (errors
/// report file offsets). Shared with the `.mica` reader, whose sections use GGUF's encoding.
pub(crate) struct Cursor<'a> {
    pub path: &'a Path,
    pub buf: &'a [u8],
    pub pos: usize,
    pub base: u64,
}

impl<'a> Cursor<'a> {
    pub fn err(&self, offset: usize, msg: impl Into<String>) -> FormatError {
        FormatError::Parse {
            path: self.path.to_path_buf(),
            offset: self.base + offset as u64,
            msg: msg.into(),
        }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(
                self.pos,
                format!(
                    "file is truncated: reading {what} needs {n} bytes but only {} remain",
                    self.remaining()
                ),
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that must fit in what is left of the file, given a minimum encoded size per
    /// item. Rejects absurd counts before anything is allocated.
    pub fn count(&mut self, what: &str, min_item_bytes: usize) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let max = (self.remaining() / min_item_bytes.max(1)) as u64;
        if n > max {
            return Err(self.err(
                at,
                format!(
                    "{what} is {n}, impossible with {} bytes left: the file is truncated or corrupt",
                    self.remaining()
                ),
            ));
        }
        Ok(n as usize)
    }

    pub fn string(&mut self, what: &str) -> Result<String> {
        let at = self.pos;
        let len = self.count(&format!("length of {what}"), 1)?;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => Err(self.err(at, format!("{what} is not valid UTF-8 ({e})"))),
        }
    }
}

/// Minimum encoded size of one value of a type (used to bound array lengths).
fn min_size(ty: u32) -> usize {
    match ty {
        type_id::U8 | type_id::I8 | type_id::BOOL => 1,
        type_id::U16 | type_id::I16 => 2,
        type_id::U32 | type_id::I32 | type_id::F32 => 4,
        type_id::U64 | type_id::I64 | type_id::F64 | type_id::STRING => 8,
        type_id::ARRAY => 12,
        _ => 1,
    }
}

pub(crate) fn read_value(c: &mut Cursor, ty: u32, key: &str, depth: u32) -> Result<MetaValue> {
    let at = c.pos;
    Ok(match ty {
        type_id::U8 => MetaValue::U8(c.array::<1>(key)?[0]),
        type_id::I8 => MetaValue::I8(c.array::<1>(key)?[0] as i8),
        type_id::U16 => MetaValue::U16(u16::from_le_bytes(c.array(key)?)),
        type_id::I16 => MetaValue::I16(i16::from_le_bytes(c.array(key)?)),
        type_id::U32 => MetaValue::U32(c.u32(key)?),
        type_id::I32 => MetaValue::I32(i32::from_le_bytes(c.array(key)?)),
        type_id::F32 => MetaValue::F32(f32::from_le_bytes(c.array(key)?)),
        type_id::U64 => MetaValue::U64(c.u64(key)?),
        type_id::I64 => MetaValue::I64(i64::from_le_bytes(c.array(key)?)),
        type_id::F64 => MetaValue::F64(f64::from_le_bytes(c.array(key)?)),
        type_id::BOOL => {
            let b = c.array::<1>(key)?[0];
            match b {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                _ => return Err(c.err(at, format!("'{key}': bool value is {b}, not 0 or 1"))),
            }
        }
        type_id::STRING => MetaValue::String(c.string(&format!("value of '{key}'"))?),
        type_id::ARRAY => MetaValue::Array(read_array(c, key, depth + 1)?),
        _ => return Err(c.err(at, format!("'{key}': unknown metadata value type {ty}"))),
    })
}

fn read_array(c: &mut Cursor, key: &str, depth: u32) -> Result<MetaArray> {
    let at = c.pos;
    if depth > MAX_ARRAY_DEPTH {
        return Err(c.err(
            at,
            format!("'{key}': arrays nested deeper than {MAX_ARRAY_DEPTH}"),
        ));
    }
    let elem = c.u32(&format!("element type of '{key}'"))?;
    let what = format!("length of array '{key}'");
    let n = c.count(&what, min_size(elem))?;
    macro_rules! prim {
        ($variant:ident, $t:ty) => {{
            const W: usize = std::mem::size_of::<$t>();
            let bytes = c.take(n * W, key)?;
            MetaArray::$variant(
                bytes
                    .chunks_exact(W)
                    .map(|b| <$t>::from_le_bytes(b.try_into().expect("chunk of W bytes")))
                    .collect(),
            )
        }};
    }
    Ok(match elem {
        type_id::U8 => MetaArray::U8(c.take(n, key)?.to_vec()),
        type_id::I8 => MetaArray::I8(c.take(n, key)?.iter().map(|&b| b as i8).collect()),
        type_id::U16 => prim!(U16, u16),
        type_id::I16 => prim!(I16, i16),
        type_id::U32 => prim!(U32, u32),
        type_id::I32 => prim!(I32, i32),
        type_id::F32 => prim!(F32, f32),
        type_id::U64 => prim!(U64, u64),
        type_id::I64 => prim!(I64, i64),
        type_id::F64 => prim!(F64, f64),
        type_id::BOOL => {
            let bytes = c.take(n, key)?;
            if let Some(i) = bytes.iter().position(|&b| b > 1) {
                return Err(c.err(at, format!("'{key}': element {i} is not a bool")));
            }
            MetaArray::Bool(bytes.iter().map(|&b| b == 1).collect())
        }
        type_id::STRING => {
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                v.push(c.string(&format!("element {i} of '{key}'"))?);
            }
            MetaArray::String(v)
        }
        type_id::ARRAY => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_array(c, key, depth + 1)?);
            }
            MetaArray::Array(v)
        }
        _ => return Err(c.err(at, format!("'{key}': unknown array element type {elem}"))),
    })
}

/// Reads `count u64` then that many `key string, value_type u32, value` entries (the GGUF
/// metadata encoding), refusing duplicate keys.
pub(crate) fn read_kv_list(c: &mut Cursor) -> Result<Vec<(String, MetaValue)>> {
    let n_kv = c.count("metadata count", 13)?;
    let mut metadata = Vec::with_capacity(n_kv);
    let mut keys = HashSet::with_capacity(n_kv);
    for i in 0..n_kv {
        let at = c.pos;
        let key = c.string(&format!("key of metadata entry {i}"))?;
        if !keys.insert(key.clone()) {
            return Err(c.err(at, format!("duplicate metadata key '{key}'")));
        }
        let ty = c.u32(&format!("type of '{key}'"))?;
        let value = read_value(c, ty, &key, 0)?;
        metadata.push((key, value));
    }
    Ok(metadata)
}

pub(super) fn parse(path: &Path, buf: &[u8]) -> Result<Parsed> {
    let mut c = Cursor {
        path,
        buf,
        pos: 0,
        base: 0,
    };
    let magic = c.take(4, "magic")?;
    if magic != GGUF_MAGIC {
        return Err(c.err(
            0,
            format!(
                "not a GGUF file: magic is {:?} ({}), expected \"GGUF\" (or a .mica file's \"\\x89MICA\\r\\n\\x1a\")",
                String::from_utf8_lossy(magic),
                hex(magic)
            ),
        ));
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(c.err(
                4,
                "GGUF version 1 is obsolete and not supported (need 2 or 3)",
            ));
        }
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(c.err(4, "big-endian GGUF files are not supported"));
        }
        v => return Err(c.err(4, format!("unsupported GGUF version {v} (need 2 or 3)"))),
    }
    // Each tensor info takes at least 8 (name len) + 4 (n_dims) + 4 (type) + 8 (offset).
    let n_tensors = c.count("tensor count", 24)?;
    // Each key-value takes at least 8 (key len) + 4 (type) + 1.
    let n_kv = c.count("metadata count", 13)?;

    let mut metadata = Vec::with_capacity(n_kv);
    let mut keys = HashSet::with_capacity(n_kv);
    for i in 0..n_kv {
        let at = c.pos;
        let key = c.string(&format!("key of metadata entry {i}"))?;
        if !keys.insert(key.clone()) {
            return Err(c.err(at, format!("duplicate metadata key '{key}'")));
        }
        let ty = c.u32(&format!("type of '{key}'"))?;
        let value = read_value(&mut c, ty, &key, 0)?;
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, v)) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() => a,
            _ => {
                return Err(FormatError::Metadata {
                    path: path.to_path_buf(),
                    key: "general.alignment".into(),
                    msg: format!("must be a power of two, got {v}"),
                });
            }
        },
    };

    let mut raw = Vec::with_capacity(n_tensors);
    let mut names = HashSet::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let at = c.pos;
        let name = c.string(&format!("name of tensor {i}"))?;
        if !names.insert(name.clone()) {
            return Err(c.err(at, format!("duplicate tensor name '{name}'")));
        }
        let n_dims = c.u32(&format!("rank of '{name}'"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(c.err(
                at,
                format!("tensor '{name}' has {n_dims} dimensions (must be 1 to {MAX_DIMS})"),
            ));
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            shape.push(c.u64(&format!("shape of '{name}'"))?);
        }
        let ggml_type = GgmlType(c.u32(&format!("type of '{name}'"))?);
        let offset = c.u64(&format!("offset of '{name}'"))?;
        raw.push((name, shape, ggml_type, offset));
    }

    // A file without tensors (a vocabulary-only GGUF, as llama.cpp's `models/ggml-vocab-*`)
    // may end right after its metadata, without the padding to the (empty) data section.
    let aligned = align_up(c.pos as u64, alignment);
    let aligned = match aligned {
        Some(d) if n_tensors == 0 => Some(d.min(buf.len() as u64)),
        other => other,
    };
    let data_offset = aligned.filter(|&d| d <= buf.len() as u64).ok_or_else(|| {
        c.err(
            c.pos,
            "file is truncated: it ends before the tensor data section",
        )
    })?;

    let file_len = buf.len() as u64;
    let mut tensors = Vec::with_capacity(raw.len());
    for (name, shape, ggml_type, rel_offset) in raw {
        let terr = |msg: String| FormatError::Tensor {
            path: path.to_path_buf(),
            tensor: name.clone(),
            msg,
        };
        let n_elements = shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| terr(format!("shape {shape:?} overflows")))?;
        let n_bytes = match ggml_type.geometry() {
            Some((block, size)) => {
                if shape[0] % block != 0 {
                    return Err(terr(format!(
                        "row length {} is not a multiple of the {} block size {block}",
                        shape[0],
                        ggml_type.name()
                    )));
                }
                (n_elements / block)
                    .checked_mul(size)
                    .ok_or_else(|| terr(format!("byte size of shape {shape:?} overflows")))?
            }
            None => {
                return Err(terr(format!(
                    "has unknown tensor type id {} (not a ggml type this reader knows)",
                    ggml_type.0
                )));
            }
        };
        if rel_offset % alignment != 0 {
            return Err(terr(format!(
                "data offset {rel_offset} is not a multiple of the alignment {alignment}"
            )));
        }
        let start = data_offset.checked_add(rel_offset);
        let end = start.and_then(|s| s.checked_add(n_bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => tensors.push(TensorInfo {
                name: name.clone(),
                ggml_type,
                shape,
                offset: start,
                n_bytes,
            }),
            _ => {
                return Err(terr(format!(
                    "data range {}..+{n_bytes} lies past the end of the file ({file_len} bytes); \
                     the file is truncated or corrupt",
                    data_offset.saturating_add(rel_offset)
                )));
            }
        }
    }

    Ok(Parsed {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|v| v / a * a)
}

fn hex(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}
