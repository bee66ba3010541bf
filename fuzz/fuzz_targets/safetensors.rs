//! The safetensors reader: the length-prefixed JSON header and every tensor range.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "scratch.rs"]
mod scratch;

fuzz_target!(|data: &[u8]| {
    let path = scratch::write(data, "safetensors");
    if let Ok(f) = mica_formats::SafetensorsFile::open(&path) {
        let _ = f.metadata().len();
        let mut sum = 0u64;
        for t in f.tensors() {
            sum += f.tensor_data(t).len() as u64;
        }
        std::hint::black_box(sum);
    }
});
