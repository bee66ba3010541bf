//! The CPU emulator as a [`Runner`]: `kernels/` compiled as C with `tests/emu/` (by `cc`, or
//! `$CC`) into a shared library, loaded once per test process. Buffers are host memory with
//! guard bytes on both sides, checked whenever a buffer is read back or dropped.

use mica_cuda::{DeviceBuf, GpuError, Launch, Result, Runner, kernels};
use std::ffi::{CString, c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xA5;

type LaunchFn = unsafe extern "C" fn(*const c_char, u32, u32, u32, *const u8, usize) -> c_int;
type CountFn = unsafe extern "C" fn() -> c_int;
type NameFn = unsafe extern "C" fn(c_int) -> *const c_char;

pub struct Emu {
    lib: libloading::Library,
    /// The emulator runs one launch at a time (its thread-model state is global).
    lock: Mutex<()>,
}

fn build() -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("mica-cuda-emu");
    std::fs::create_dir_all(&out).unwrap();
    let all = out.join("all.c");
    let mut src = String::from("#include \"prelude.cuh\"\n");
    for (name, _) in kernels::FILES.iter().filter(|(n, _)| *n != "prelude.cuh") {
        src.push_str(&format!("#include \"{name}\"\n"));
    }
    std::fs::write(&all, src).unwrap();
    let lib = out.join(format!("emu-{}.so", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = std::process::Command::new(&cc)
        .args([
            "-O2",
            "-std=gnu11",
            "-ffp-contract=off",
            "-fPIC",
            "-shared",
            "-pthread",
        ])
        .args([
            "-Wall",
            "-Wextra",
            "-Wno-unused-parameter",
            "-Werror",
            "-DMICA_EMU",
        ])
        .arg("-I")
        .arg(crate_dir.join("kernels"))
        .arg("-I")
        .arg(crate_dir.join("tests/emu"))
        .arg("-o")
        .arg(&lib)
        .arg(&all)
        .arg(crate_dir.join("tests/emu/emu.c"))
        .arg("-lm")
        .status()
        .unwrap_or_else(|e| panic!("could not run the C compiler {cc:?} for the emulator: {e}"));
    assert!(status.success(), "the emulator did not compile ({cc})");
    lib
}

/// The process's emulator (compiled on first use).
/// Device memory the emulator reports (free and total).
pub const EMU_MEMORY: usize = 1 << 30;

pub fn emu() -> &'static Emu {
    static EMU: OnceLock<Emu> = OnceLock::new();
    EMU.get_or_init(|| {
        let path = build();
        // SAFETY: our own library; its constructors only register kernels.
        let lib = unsafe { libloading::Library::new(&path) }.expect("load the emulator");
        Emu {
            lib,
            lock: Mutex::new(()),
        }
    })
}

impl Emu {
    /// The kernels the compiled sources registered.
    pub fn kernel_names(&self) -> Vec<String> {
        // SAFETY: the symbols have these signatures in emu.c.
        unsafe {
            let count: libloading::Symbol<CountFn> = self.lib.get(b"emu_n_kernels").unwrap();
            let name: libloading::Symbol<NameFn> = self.lib.get(b"emu_kernel_name").unwrap();
            (0..count())
                .map(|i| {
                    std::ffi::CStr::from_ptr(name(i))
                        .to_string_lossy()
                        .into_owned()
                })
                .collect()
        }
    }
}

/// Host memory standing in for device memory, between guard bytes.
pub struct EmuBuf {
    base: *mut u8,
    len: usize,
}

// SAFETY: the memory is owned by the buffer; the emulator's kernels touch it only during a
// launch, under the emulator's lock.
unsafe impl Send for EmuBuf {}
unsafe impl Sync for EmuBuf {}

impl EmuBuf {
    fn new(data: Option<&[u8]>, len: usize) -> EmuBuf {
        // u64 words: 8-byte alignment, as device allocations have at least.
        let words = (len + 2 * GUARD).div_ceil(8);
        let mem = vec![0u64; words].into_boxed_slice();
        let base = Box::into_raw(mem).cast::<u8>();
        // SAFETY: `base` points at `words * 8` bytes we own.
        unsafe {
            std::ptr::write_bytes(base, GUARD_BYTE, GUARD);
            std::ptr::write_bytes(base.add(GUARD + len), GUARD_BYTE, words * 8 - GUARD - len);
            if let Some(d) = data {
                std::ptr::copy_nonoverlapping(d.as_ptr(), base.add(GUARD), len);
            }
        }
        EmuBuf { base, len }
    }

    fn words(&self) -> usize {
        (self.len + 2 * GUARD).div_ceil(8)
    }

    fn check_guards(&self) {
        // SAFETY: the guard regions lie inside the allocation.
        let (front, back) = unsafe {
            (
                std::slice::from_raw_parts(self.base, GUARD),
                std::slice::from_raw_parts(
                    self.base.add(GUARD + self.len),
                    self.words() * 8 - GUARD - self.len,
                ),
            )
        };
        assert!(
            front.iter().chain(back).all(|&b| b == GUARD_BYTE),
            "a kernel wrote outside a buffer of {} bytes",
            self.len
        );
    }
}

impl Drop for EmuBuf {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.check_guards();
        }
        // SAFETY: `base` came from `Box::into_raw` of a `[u64]` of `words()` words.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.base.cast::<u64>(),
                self.words(),
            )));
        }
    }
}

impl DeviceBuf for EmuBuf {
    fn addr(&self) -> u64 {
        // SAFETY: inside the allocation.
        unsafe { self.base.add(GUARD) as u64 }
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Runner for Emu {
    type Buf = EmuBuf;

    fn alloc(&self, bytes: usize) -> Result<EmuBuf> {
        Ok(EmuBuf::new(None, bytes))
    }

    fn upload(&self, data: &[u8]) -> Result<EmuBuf> {
        Ok(EmuBuf::new(Some(data), data.len()))
    }

    fn download(&self, buf: &EmuBuf) -> Result<Vec<u8>> {
        let _g = self.lock.lock().unwrap();
        buf.check_guards();
        let mut v = vec![0u8; buf.len];
        // SAFETY: `len` bytes after the front guard belong to the buffer.
        unsafe { std::ptr::copy_nonoverlapping(buf.base.add(GUARD), v.as_mut_ptr(), buf.len) };
        Ok(v)
    }

    fn launch(&self, name: &str, dims: Launch, params: &[u8]) -> Result<()> {
        let _g = self.lock.lock().unwrap();
        let cname = CString::new(name).unwrap();
        // SAFETY: emu_launch's signature in emu.c; `params` outlives the call, and the
        // kernels touch only the buffers the ops checked.
        let rc = unsafe {
            let f: libloading::Symbol<LaunchFn> = self.lib.get(b"emu_launch").unwrap();
            f(
                cname.as_ptr(),
                dims.grid,
                dims.block,
                0,
                params.as_ptr(),
                params.len(),
            )
        };
        match rc {
            0 => Ok(()),
            -1 => Err(GpuError::UnknownKernel(name.into())),
            -2 => panic!(
                "{name}: the Rust parameter struct ({} bytes) is not the C one's size",
                params.len()
            ),
            _ => Err(GpuError::Shape(format!("{name}: launch shape {dims:?}"))),
        }
    }

    /// The emulator's memory is the host's: it reports what [`EMU_MEMORY`] says.
    fn memory(&self) -> Result<(usize, usize)> {
        Ok((EMU_MEMORY, EMU_MEMORY))
    }
}
