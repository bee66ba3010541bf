//! A GGUF v3 writer. It builds files in memory or streams them to a writer: used by tests to
//! make small or deliberately broken files, and by conversion tools.

use super::metadata::{MetaArray, MetaValue, type_id};
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::ggml_types::GgmlType;
use std::io::{self, Write};

/// A tensor to write: the bytes must already be in the tensor's type.
pub struct TensorEntry<'a> {
    pub name: String,
    pub ggml_type: GgmlType,
    /// Innermost dimension first, as in [`crate::TensorInfo::shape`].
    pub shape: Vec<u64>,
    pub data: &'a [u8],
}

/// Collects metadata and tensors, then writes a GGUF v3 file.
#[derive(Default)]
pub struct GgufWriter<'a> {
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorEntry<'a>>,
}

impl<'a> GgufWriter<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn meta(&mut self, key: &str, value: MetaValue) -> &mut Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    pub fn tensor(
        &mut self,
        name: &str,
        ggml_type: GgmlType,
        shape: &[u64],
        data: &'a [u8],
    ) -> &mut Self {
        self.tensors.push(TensorEntry {
            name: name.to_string(),
            ggml_type,
            shape: shape.to_vec(),
            data,
        });
        self
    }

    fn alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Writes the whole file.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let align = self.alignment();
        let mut head = Vec::new();
        head.extend_from_slice(GGUF_MAGIC);
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut head, k);
            put_value(&mut head, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            put_str(&mut head, &t.name);
            head.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for d in &t.shape {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.ggml_type.0.to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len() as u64).div_ceil(align) * align;
        }
        let pad = (head.len() as u64).div_ceil(align) * align - head.len() as u64;
        head.resize(head.len() + pad as usize, 0);
        w.write_all(&head)?;
        let mut written = 0u64;
        for (t, off) in self.tensors.iter().zip(offsets) {
            w.write_all(&vec![0u8; (off - written) as usize])?;
            w.write_all(t.data)?;
            written = off + t.data.len() as u64;
        }
        Ok(())
    }

    /// The whole file as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.write_to(&mut v).expect("writing to a Vec cannot fail");
        v
    }
}

/// Writes `count u64` then each `key, type, value` (the GGUF metadata encoding).
pub(crate) fn put_kv_list(out: &mut Vec<u8>, entries: &[(String, MetaValue)]) {
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for (k, v) in entries {
        put_str(out, k);
        put_value(out, v);
    }
}

pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn value_type(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => type_id::U8,
        MetaValue::I8(_) => type_id::I8,
        MetaValue::U16(_) => type_id::U16,
        MetaValue::I16(_) => type_id::I16,
        MetaValue::U32(_) => type_id::U32,
        MetaValue::I32(_) => type_id::I32,
        MetaValue::F32(_) => type_id::F32,
        MetaValue::Bool(_) => type_id::BOOL,
        MetaValue::String(_) => type_id::STRING,
        MetaValue::Array(_) => type_id::ARRAY,
        MetaValue::U64(_) => type_id::U64,
        MetaValue::I64(_) => type_id::I64,
        MetaValue::F64(_) => type_id::F64,
    }
}

pub(crate) fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    out.extend_from_slice(&value_type(v).to_le_bytes());
    put_payload(out, v);
}

fn put_payload(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.push(*x as u8),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(*x as u8),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Array(a) => put_array(out, a),
    }
}

fn put_array(out: &mut Vec<u8>, a: &MetaArray) {
    macro_rules! prim {
        ($ty:expr, $v:expr) => {{
            out.extend_from_slice(&$ty.to_le_bytes());
            out.extend_from_slice(&($v.len() as u64).to_le_bytes());
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }};
    }
    match a {
        MetaArray::U8(v) => prim!(type_id::U8, v),
        MetaArray::I8(v) => prim!(type_id::I8, v),
        MetaArray::U16(v) => prim!(type_id::U16, v),
        MetaArray::I16(v) => prim!(type_id::I16, v),
        MetaArray::U32(v) => prim!(type_id::U32, v),
        MetaArray::I32(v) => prim!(type_id::I32, v),
        MetaArray::F32(v) => prim!(type_id::F32, v),
        MetaArray::U64(v) => prim!(type_id::U64, v),
        MetaArray::I64(v) => prim!(type_id::I64, v),
        MetaArray::F64(v) => prim!(type_id::F64, v),
        MetaArray::Bool(v) => {
            out.extend_from_slice(&type_id::BOOL.to_le_bytes());
            out.extend_from_slice(&(v.len() as u64).to_le_bytes());
            out.extend(v.iter().map(|&b| b as u8));
        }
        MetaArray::String(v) => {
            out.extend_from_slice(&type_id::STRING.to_le_bytes());
            out.extend_from_slice(&(v.len() as u64).to_le_bytes());
            for s in v {
                put_str(out, s);
            }
        }
        MetaArray::Array(v) => {
            out.extend_from_slice(&type_id::ARRAY.to_le_bytes());
            out.extend_from_slice(&(v.len() as u64).to_le_bytes());
            for x in v {
                put_array(out, x);
            }
        }
    }
}
