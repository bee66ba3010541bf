//! Compiling a chat template (the Jinja source a model file carries) and rendering a fixed
//! conversation with it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mica_models::chat::{ChatMessage, ChatTemplate};

fuzz_target!(|data: &[u8]| {
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(t) = ChatTemplate::new(source, "<s>", "</s>") else {
        return;
    };
    let messages = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi {{ there }} <|im_end|>"),
        ChatMessage::new("assistant", "Hello."),
        ChatMessage::new("user", "Bye"),
    ];
    let _ = t.render(&messages, true);
    let _ = t.render(&messages[1..2], false);
});
