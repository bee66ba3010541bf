//! Block geometry of every ggml tensor type, including the ones mica cannot compute with.
//!
//! A file may hold types mica does not implement (integer tensors, F64). Knowing their
//! block geometry still lets the reader validate every tensor's byte range and lets
//! `mica inspect` describe the file; using such a tensor for compute is what fails, with an
//! error naming the type and the tensor.

use mica_kernels::DType;
use mica_kernels::dtype::ggml_type_name;

/// (ggml id, elements per block, bytes per block) for types outside [`DType`].
const OTHER_TYPES: &[(u32, u64, u64)] = &[
    (24, 1, 1), // I8
    (25, 1, 2), // I16
    (26, 1, 4), // I32
    (27, 1, 8), // I64
    (28, 1, 8), // F64
];

/// A ggml type id as found in a file, with its geometry when known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GgmlType(pub u32);

impl GgmlType {
    /// The mica type, if mica computes with this type.
    pub fn dtype(self) -> Option<DType> {
        DType::from_ggml_id(self.0)
    }

    /// ggml's name, or `type <id>` for an id ggml never assigned.
    pub fn name(self) -> String {
        match ggml_type_name(self.0) {
            Some(n) => n.to_string(),
            None => format!("unknown type id {}", self.0),
        }
    }

    /// (elements per block, bytes per block), if known.
    pub fn geometry(self) -> Option<(u64, u64)> {
        if let Some(t) = self.dtype() {
            return Some((t.block_size() as u64, t.type_size() as u64));
        }
        OTHER_TYPES
            .iter()
            .find(|(id, _, _)| *id == self.0)
            .map(|&(_, b, s)| (b, s))
    }

    /// Bytes a tensor of `shape` (innermost first) takes, if the type is known, the row
    /// length a multiple of its block, and nothing overflows.
    pub fn n_bytes(self, shape: &[u64]) -> Option<u64> {
        let (block, size) = self.geometry()?;
        let n = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
        if shape.first().copied().unwrap_or(1) % block != 0 {
            return None;
        }
        (n / block).checked_mul(size)
    }
}
