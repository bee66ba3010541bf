//! The one description of a tensor that every file format produces.

use crate::ggml_types::GgmlType;
use mica_kernels::DType;

/// A tensor stored in a model file. The bytes stay in the file's memory map; this only
/// says where they are and how to read them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// The stored type as the file names it; see [`TensorInfo::dtype`].
    pub ggml_type: GgmlType,
    /// Dimensions innermost first, as ggml orders them: `shape[0]` is the length of one
    /// row (the contiguous dimension), `shape[1]` the number of rows of a matrix.
    pub shape: Vec<u64>,
    /// Absolute byte offset of the first element in the file.
    pub offset: u64,
    /// Bytes the tensor occupies.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// The element type, when mica computes with it.
    pub fn dtype(&self) -> Option<DType> {
        self.ggml_type.dtype()
    }

    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Length of one row (the innermost dimension).
    pub fn row_len(&self) -> u64 {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Number of rows (the product of all but the innermost dimension).
    pub fn n_rows(&self) -> u64 {
        self.shape.iter().skip(1).product()
    }
}

/// A file whose mapped bytes hold tensors ([`TensorInfo::offset`] is relative to them).
pub trait TensorBytes: Send + Sync {
    fn bytes(&self) -> &[u8];
}

impl TensorBytes for crate::GgufFile {
    fn bytes(&self) -> &[u8] {
        crate::GgufFile::bytes(self)
    }
}

impl TensorBytes for crate::SafetensorsFile {
    fn bytes(&self) -> &[u8] {
        crate::SafetensorsFile::bytes(self)
    }
}
