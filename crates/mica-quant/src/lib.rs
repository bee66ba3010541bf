//! mica-quant: converting and quantizing models, and measuring what quantization costs.
//!
//! - [`convert()`]: a GGUF file, `.mica` file or Hugging Face folder in, `.mica` or GGUF out,
//!   optionally quantized: llama.cpp's per-tensor rules ([`FileType`]), per-tensor
//!   overrides ([`TensorTypeRule`]), importance-weighted quantizers, error-compensating
//!   quantization (GPTQ) and mixed precision for a bits-per-weight budget (`mix`, with an
//!   optional KL-divergence probe). `docs/convert.md` describes each step.
//! - [`imatrix`]: importance matrices — collection over calibration text and the GGUF and
//!   legacy `.dat` files llama.cpp reads and writes.
//! - [`perplexity`]: perplexity and KL-divergence over windows of text, computed as
//!   llama.cpp's `llama-perplexity` computes them.
//!
//! Options come in typed structs; progress, warnings and notes go to a callback as
//! [`Event`]s (this crate never prints or draws); failures are [`QuantError`]s that name the
//! file, tensor or option at fault.

pub mod convert;
pub mod error;
pub mod imatrix;
pub mod perplexity;
pub mod progress;

pub use convert::gptq::GptqError;
pub use convert::overrides::TensorTypeRule;
pub use convert::rules::FileType;
pub use convert::{
    Calibration, ConvertOptions, ConvertReport, Importance, MixReport, MixedTensor, convert,
};
pub use error::{QuantError, Result};
pub use imatrix::Imatrix;
pub use perplexity::{KlStats, KlSummary, Nll, Perplexity, PerplexityOptions, PerplexityReport};
pub use progress::{Event, Notice, Task};
