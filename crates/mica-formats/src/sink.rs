//! The streaming interface both writers (`.mica` and GGUF) offer to converters: tensors
//! are written one at a time, each in as many chunks as the caller likes, so converting
//! needs memory for one chunk, not for the model.

use crate::error::Result;
use crate::ggml_types::GgmlType;

/// A model file being written tensor by tensor.
pub trait TensorSink {
    /// Starts a tensor; its bytes follow through [`TensorSink::write_data`].
    fn begin_tensor(&mut self, name: &str, ggml_type: GgmlType, shape: &[u64]) -> Result<()>;
    /// Appends bytes of the current tensor.
    fn write_data(&mut self, bytes: &[u8]) -> Result<()>;
    /// Ends the current tensor; fails if fewer or more bytes than its shape needs came.
    fn end_tensor(&mut self) -> Result<()>;
    /// Writes what remains (directories, headers), fsyncs and renames into place. Until
    /// this returns, nothing exists at the target path.
    fn finish(self: Box<Self>) -> Result<()>;
    /// Bytes written so far (for progress).
    fn bytes_written(&self) -> u64;
}
