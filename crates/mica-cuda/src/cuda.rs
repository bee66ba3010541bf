//! The CUDA implementation of [`Runner`]: one device, one stream, every module compiled by
//! NVRTC for the device's architecture when it is opened.

use crate::kernels::{MODULES, compile};
use crate::runner::{DeviceBuf, Launch, Runner};
use crate::{GpuError, Result};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use std::collections::HashMap;
use std::sync::Arc;

/// Whether the CUDA driver library can be opened (false on machines without an NVIDIA
/// driver; nothing else here touches the driver before [`Cuda::open`]).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its known names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether NVRTC can be opened.
pub fn nvrtc_present() -> bool {
    // SAFETY: as `driver_present`.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

fn driver(e: cudarc::driver::DriverError) -> GpuError {
    GpuError::Driver(e.to_string())
}

/// An opened GPU with every kernel loaded.
pub struct Cuda {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    functions: HashMap<String, CudaFunction>,
    name: String,
    capability: (i32, i32),
}

impl Cuda {
    /// Opens device `ordinal` and compiles and loads every kernel module for it.
    pub fn open(ordinal: usize) -> Result<Cuda> {
        if !driver_present() {
            return Err(GpuError::NoDriver);
        }
        let ctx = CudaContext::new(ordinal).map_err(driver)?;
        let capability = ctx.compute_capability().map_err(driver)?;
        let name = ctx.name().map_err(driver)?;
        let arch = format!("compute_{}{}", capability.0, capability.1);
        let mut functions = HashMap::new();
        for m in MODULES {
            let ptx = compile(m, &arch)?;
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
                .map_err(driver)?;
            for k in m.kernels() {
                let f = module.load_function(&k).map_err(driver)?;
                functions.insert(k, f);
            }
        }
        let stream = ctx.default_stream();
        Ok(Cuda {
            ctx,
            stream,
            functions,
            name,
            capability,
        })
    }

    /// The device's name, as the driver gives it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability (major, minor).
    pub fn capability(&self) -> (i32, i32) {
        self.capability
    }
}

/// Device memory of a [`Cuda`].
pub struct CudaBuf {
    slice: CudaSlice<u8>,
    addr: u64,
    len: usize,
}

impl DeviceBuf for CudaBuf {
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// A parameter struct's bytes, passed by value: the driver copies as many bytes as the
/// kernel's parameter takes.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct ParamBlock([u8; 256]);

// SAFETY: plain bytes, copied to the kernel's parameter space as they are.
unsafe impl DeviceRepr for ParamBlock {}

impl Cuda {
    fn wrap(&self, slice: CudaSlice<u8>, len: usize) -> CudaBuf {
        let addr = {
            let (ptr, _sync) = slice.device_ptr(&self.stream);
            ptr
        };
        CudaBuf { slice, addr, len }
    }
}

impl Runner for Cuda {
    type Buf = CudaBuf;

    fn alloc(&self, bytes: usize) -> Result<CudaBuf> {
        let slice = self
            .stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(driver)?;
        Ok(self.wrap(slice, bytes))
    }

    fn upload(&self, data: &[u8]) -> Result<CudaBuf> {
        if data.is_empty() {
            return self.alloc(0);
        }
        let slice = self.stream.clone_htod(data).map_err(driver)?;
        Ok(self.wrap(slice, data.len()))
    }

    fn download(&self, buf: &CudaBuf) -> Result<Vec<u8>> {
        let mut v = self.stream.clone_dtoh(&buf.slice).map_err(driver)?;
        self.stream.synchronize().map_err(driver)?;
        v.truncate(buf.len);
        Ok(v)
    }

    fn launch(&self, name: &str, dims: Launch, params: &[u8]) -> Result<()> {
        let f = self
            .functions
            .get(name)
            .ok_or_else(|| GpuError::UnknownKernel(name.into()))?;
        let mut block = ParamBlock([0; 256]);
        if params.len() > block.0.len() {
            return Err(GpuError::Shape(format!(
                "{name}: {} bytes of parameters",
                params.len()
            )));
        }
        block.0[..params.len()].copy_from_slice(params);
        let cfg = LaunchConfig {
            grid_dim: (dims.grid, 1, 1),
            block_dim: (dims.block, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&block);
        // SAFETY: `params` is the kernel's own parameter struct (the ops build it), whose
        // pointers are live device buffers the ops checked the extents of.
        unsafe { b.launch(cfg) }.map_err(driver)?;
        Ok(())
    }

    fn memory(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(driver)
    }
}
