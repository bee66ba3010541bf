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

    /// Drops the resident pages wholly inside `bytes()[start..start + len]` from this
    /// process (a later read faults them in again from the file). A no-op by default, for
    /// bytes that are not a file mapping.
    fn release(&self, _start: usize, _len: usize) {}
}

/// [`TensorBytes::release`] for a read-only file mapping.
pub(crate) fn release_mapped(map: &memmap2::Mmap, start: usize, len: usize) {
    let page = 4096;
    let (lo, hi) = (start.next_multiple_of(page), (start + len) / page * page);
    if hi > lo {
        // SAFETY: the mapping is a read-only view of a file; after MADV_DONTNEED its pages
        // are read again from the file on the next access, so every byte keeps its value.
        // Failure only means the pages stay resident.
        let _ =
            unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, lo, hi - lo) };
    }
}

impl TensorBytes for crate::GgufFile {
    fn bytes(&self) -> &[u8] {
        crate::GgufFile::bytes(self)
    }

    fn release(&self, start: usize, len: usize) {
        release_mapped(self.mmap(), start, len)
    }
}

impl TensorBytes for crate::SafetensorsFile {
    fn bytes(&self) -> &[u8] {
        crate::SafetensorsFile::bytes(self)
    }

    fn release(&self, start: usize, len: usize) {
        release_mapped(self.mmap(), start, len)
    }
}

/// One file of a checkpoint folder (a safetensors shard, a PyTorch archive): where its
/// tensors are and what they are.
pub trait TensorFile: TensorBytes {
    fn path(&self) -> &std::path::Path;

    /// The file format, as `mica inspect` names it.
    fn format(&self) -> &'static str;

    /// Tensors in file order.
    fn tensors(&self) -> &[TensorInfo];

    /// Names of tensors the file holds but leaves out of [`TensorFile::tensors`] (types
    /// mica never computes with).
    fn left_out(&self) -> Vec<String> {
        Vec::new()
    }

    /// The bytes of one tensor of this file (validated when the file was opened).
    fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        &self.bytes()[t.offset as usize..(t.offset + t.n_bytes) as usize]
    }
}

impl TensorFile for crate::SafetensorsFile {
    fn path(&self) -> &std::path::Path {
        crate::SafetensorsFile::path(self)
    }

    fn format(&self) -> &'static str {
        "safetensors"
    }

    fn tensors(&self) -> &[TensorInfo] {
        crate::SafetensorsFile::tensors(self)
    }
}
