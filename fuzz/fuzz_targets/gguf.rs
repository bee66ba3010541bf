//! The GGUF reader: any bytes must give a validated file or an error, never a panic, and
//! every tensor range the reader accepts must be readable.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "scratch.rs"]
mod scratch;

fuzz_target!(|data: &[u8]| {
    let path = scratch::write(data, "gguf");
    if let Ok(f) = mica_formats::GgufFile::open(&path) {
        for (key, _) in f.metadata_entries() {
            let _ = f.get_str(key);
            let _ = f.get_u64(key);
        }
        let mut sum = 0u64;
        for t in f.tensors() {
            let d = f.tensor_data(t);
            sum += d.first().copied().unwrap_or(0) as u64 + d.last().copied().unwrap_or(0) as u64;
        }
        std::hint::black_box(sum);
    }
});
