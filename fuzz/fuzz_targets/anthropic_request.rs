//! Parsing and validating Anthropic request bodies (`/v1/messages`,
//! `/v1/messages/count_tokens`) as the server does, without a socket: any bytes give a
//! checked request or a 400 naming the field, never a panic; rendering the error must work
//! too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mica_server::Flavor;
use mica_server::anthropic::{parse_count_tokens, parse_messages};

fuzz_target!(|data: &[u8]| {
    if let Err(e) = parse_messages(data) {
        let _ = e.body(Flavor::Anthropic);
    }
    if let Err(e) = parse_count_tokens(data) {
        let _ = e.body(Flavor::Anthropic);
    }
});
