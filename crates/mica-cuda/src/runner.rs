//! The device-side interface the ops are written against: memory and kernel launches.

use crate::Result;

/// A block of device memory: an address kernels can read and its length in bytes.
pub trait DeviceBuf {
    /// The address kernels see (a device pointer; a host pointer under the emulator).
    fn addr(&self) -> u64;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A 1-D launch: `grid` blocks of `block` threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub grid: u32,
    pub block: u32,
}

/// Allocates, copies and launches on one device (one stream: launches run in order).
pub trait Runner {
    type Buf: DeviceBuf;
    /// `bytes` of zeroed device memory.
    fn alloc(&self, bytes: usize) -> Result<Self::Buf>;
    /// A copy of `data` on the device.
    fn upload(&self, data: &[u8]) -> Result<Self::Buf>;
    /// The buffer's bytes, after every launch before this call has finished.
    fn download(&self, buf: &Self::Buf) -> Result<Vec<u8>>;
    /// Runs kernel `name` with its parameter struct `params` (the bytes of one of
    /// [`crate::params`]' structs).
    fn launch(&self, name: &str, dims: Launch, params: &[u8]) -> Result<()>;
    /// Free and total device memory, in bytes.
    fn memory(&self) -> Result<(usize, usize)>;
}

macro_rules! forward_runner {
    ($($ty:ty),*) => {$(
        impl<T: Runner + ?Sized> Runner for $ty {
            type Buf = T::Buf;
            fn alloc(&self, bytes: usize) -> Result<Self::Buf> {
                (**self).alloc(bytes)
            }
            fn upload(&self, data: &[u8]) -> Result<Self::Buf> {
                (**self).upload(data)
            }
            fn download(&self, buf: &Self::Buf) -> Result<Vec<u8>> {
                (**self).download(buf)
            }
            fn launch(&self, name: &str, dims: Launch, params: &[u8]) -> Result<()> {
                (**self).launch(name, dims, params)
            }
            fn memory(&self) -> Result<(usize, usize)> {
                (**self).memory()
            }
        }
    )*};
}

// A runner borrowed or shared runs as itself (a decoder owns its runner either way).
forward_runner!(&T, std::sync::Arc<T>);

/// A device copy of `v`.
pub fn upload_f32<R: Runner>(r: &R, v: &[f32]) -> Result<R::Buf> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    r.upload(&bytes)
}

/// A device copy of `v`.
pub fn upload_i32<R: Runner>(r: &R, v: &[i32]) -> Result<R::Buf> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    r.upload(&bytes)
}

/// The buffer's contents as f32 values.
pub fn download_f32<R: Runner>(r: &R, buf: &R::Buf) -> Result<Vec<f32>> {
    let bytes = r.download(buf)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}
