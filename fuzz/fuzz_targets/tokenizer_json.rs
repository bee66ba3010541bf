//! Loading a Hugging Face `tokenizer.json` and using the tokenizer it builds: encoding and
//! decoding a fixed text (special tokens parsed), then decoding every id.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mica_models::tokenizer::Tokenizer;
use mica_models::tokenizer::hf_json::spec_from_hf;

fuzz_target!(|data: &[u8]| {
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(spec) = spec_from_hf(&json, None, None) else {
        return;
    };
    let Ok(tok) = Tokenizer::from_spec(&spec) else {
        return;
    };
    if let Ok(ids) = tok.encode("Hello, wörld! <|im_start|> 12345 \n\t  ✓", true, true) {
        let _ = tok.decode(&ids);
    }
    let ids: Vec<u32> = (0..tok.vocab_size().min(512) as u32).collect();
    let _ = tok.decode(&ids);
});
