//! mica-formats: reading and writing model files. GGUF, safetensors and PyTorch state dicts
//! (Hugging Face checkpoints; the pickles of the latter read without running anything) and
//! mica's own `.mica` format (`docs/format.md`), each parsed and validated up front, with tensor data left in a read-only memory map and handed out as
//! zero-copy byte slices described by one [`TensorInfo`] type.

pub mod atomic;
pub mod checkpoint;
pub mod error;
pub mod ggml_types;
pub mod gguf;
pub mod mica;
pub mod pytorch;
pub mod safetensors;
pub mod sink;
pub mod tensor;

pub use checkpoint::CheckpointSet;
pub use error::{FormatError, Result};
pub use gguf::{Container, GgufFile, GgufStreamWriter, GgufWriter, MetaArray, MetaValue};
pub use mica::{MICA_MAGIC, MicaFile, MicaWriter};
pub use pytorch::TorchFile;
pub use safetensors::SafetensorsFile;
pub use sink::TensorSink;
pub use tensor::{TensorBytes, TensorFile, TensorInfo};
