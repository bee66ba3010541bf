//! mica's CUDA backend, first layer: the kernels (CUDA C in `kernels/`, compiled at run time
//! by NVRTC for the device at hand), a [`Runner`] that allocates device memory and launches
//! them, and [`ops`], the typed launches with their shapes checked on the host.
//!
//! The driver and NVRTC are opened when first asked for ([`Cuda::open`]), so everything
//! that links this crate builds and runs on machines without CUDA. The kernels' logic is
//! tested on such machines too: `tests/emulated.rs` compiles the same sources as C against a
//! small CPU emulator of the CUDA thread model and runs every op through the same [`ops`]
//! code against scalar references; `tests/ptx.rs` compiles every module to PTX with NVRTC
//! (as CI does); `tests/device.rs` (feature `device-tests`, `scripts/test-gpu`) runs the
//! same cases on a GPU.

mod cuda;
pub mod decoder;
pub mod kernels;
pub mod ops;
pub mod params;
pub mod placement;
mod runner;

pub use cuda::{Cuda, CudaBuf, driver_present, nvrtc_present};
pub use decoder::GpuDecoder;
pub use placement::{GpuLayers, Placement};
pub use runner::{DeviceBuf, Launch, Runner, download_f32, upload_f32, upload_i32};

/// What can go wrong between the host and a GPU.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no CUDA driver on this machine (libcuda.so.1 could not be opened)")]
    NoDriver,
    #[error(
        "NVRTC, the CUDA runtime compiler, could not be opened (libnvrtc.so.12): install the CUDA toolkit or the nvidia-cuda-nvrtc-cu12 Python package and put its lib folder on LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    #[error("CUDA driver: {0}")]
    Driver(String),
    #[error("NVRTC could not compile kernel module {module}: {log}")]
    Compile { module: String, log: String },
    #[error("no kernel named {0} is loaded")]
    UnknownKernel(String),
    #[error("{0}")]
    Shape(String),
    #[error("{0} weights have no GPU kernels yet")]
    Unsupported(mica_kernels::DType),
    #[error("the GPU's memory is too small: {0}")]
    OutOfMemory(String),
    #[error("the GPU decoder does not run {0} yet")]
    UnsupportedModel(String),
}

pub type Result<T, E = GpuError> = std::result::Result<T, E>;
