//! The PyTorch checkpoint reader: the zip archive, the restricted pickle machine (any
//! bytes: a refusal or a state dict, never a panic, never a call) and every tensor range.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mica_formats::TensorFile;

#[path = "scratch.rs"]
mod scratch;

fuzz_target!(|data: &[u8]| {
    let _ = mica_formats::pytorch::pickle::load(data);
    let path = scratch::write(data, "pt");
    if let Ok(f) = mica_formats::TorchFile::open(&path) {
        let mut sum = 0u64;
        for t in f.tensors() {
            sum += f.tensor_data(t).len() as u64;
        }
        std::hint::black_box(sum);
    }
});
