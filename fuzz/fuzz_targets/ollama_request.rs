//! Parsing and validating Ollama request bodies (`/api/generate`, `/api/chat`) as the
//! server does, without a socket.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mica_server::Flavor;
use mica_server::ollama::{parse_chat, parse_generate};

fuzz_target!(|data: &[u8]| {
    if let Err(e) = parse_generate(data) {
        let _ = e.body(Flavor::Ollama);
    }
    if let Err(e) = parse_chat(data) {
        let _ = e.body(Flavor::Ollama);
    }
});
