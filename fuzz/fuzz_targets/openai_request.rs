//! Parsing and validating OpenAI request bodies (`/v1/chat/completions`,
//! `/v1/completions`) as the server does, without a socket: any bytes give a checked
//! request or a 400 naming the field, never a panic; rendering the error must work too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mica_server::Flavor;
use mica_server::openai::{parse_chat, parse_completion};

fuzz_target!(|data: &[u8]| {
    if let Err(e) = parse_chat(data) {
        let _ = e.body(Flavor::OpenAi);
    }
    if let Err(e) = parse_completion(data) {
        let _ = e.body(Flavor::OpenAi);
    }
});
