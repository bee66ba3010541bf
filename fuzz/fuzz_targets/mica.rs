//! The `.mica` reader: header, sections, tensor directory and checksums. Inputs that do not
//! start with the magic get it prepended, so the fuzzer spends its time past it.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "scratch.rs"]
mod scratch;

fuzz_target!(|data: &[u8]| {
    let magic = mica_formats::MICA_MAGIC;
    let bytes = if data.starts_with(magic) {
        data.to_vec()
    } else {
        [magic.as_slice(), data].concat()
    };
    let path = scratch::write(&bytes, "mica");
    if let Ok(f) = mica_formats::MicaFile::open(&path) {
        let _ = f.version();
        let _ = f.provenance().len();
        for i in 0..f.view().tensors().len() + 1 {
            let _ = f.verify_tensor(i);
        }
    }
});
