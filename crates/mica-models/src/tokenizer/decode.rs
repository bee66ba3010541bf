//! Turning ids back into text: the byte string ("piece") of every token, computed once at
//! load as llama.cpp's `token_to_piece` cache is, and a streaming decoder that never cuts a
//! UTF-8 character in half.
//!
//! Pieces follow llama.cpp (`llama_vocab::impl::token_to_piece`): NORMAL tokens of byte-level
//! BPE map their GPT-2 alphabet back to bytes; NORMAL SentencePiece tokens turn `▁` into a
//! space; BYTE tokens (`<0xNN>`) are that one byte, which may be a fragment of a character;
//! CONTROL, UNKNOWN and USER_DEFINED tokens are their text verbatim; UNUSED and UNDEFINED
//! tokens are empty. Decoding concatenates pieces; nothing else is added or removed (no
//! `clean_up_tokenization_spaces`, no leading-space strip), which is what llama-server
//! streams.

use super::Tokenizer;
use super::error::Result;

/// GPT-2's byte → printable character table (`bytes_to_unicode`), inverted: character → byte.
/// Printable Latin-1 bytes map to themselves; the other 68 to U+0100.. in order, so every
/// character of the alphabet is below U+0144.
pub(crate) struct Gpt2Alphabet([Option<u8>; 0x144]);

impl Gpt2Alphabet {
    pub fn new() -> Gpt2Alphabet {
        let printable =
            |b: usize| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        let mut table = [None; 0x144];
        let mut shifted = 0usize;
        for b in 0..256usize {
            let c = if printable(b) {
                b
            } else {
                shifted += 1;
                255 + shifted
            };
            table[c] = Some(b as u8);
        }
        Gpt2Alphabet(table)
    }

    pub fn byte(&self, c: char) -> Option<u8> {
        self.0.get(c as usize).copied().flatten()
    }
}

/// The bytes a byte-level BPE token stands for. A character outside the GPT-2 alphabet
/// cannot come from byte-level encoding; llama.cpp marks it the same way.
pub(crate) fn byte_level_piece(text: &str, alphabet: &Gpt2Alphabet) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match alphabet.byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// The byte of a `<0xNN>` token.
pub(crate) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Moves the longest decodable prefix of `buf` into `out`. Invalid bytes become U+FFFD, one
/// per maximal invalid sequence as `String::from_utf8_lossy` does; an incomplete character at
/// the very end stays in `buf` until more bytes arrive. Feeding bytes in any chunking and
/// flushing with [`flush_lossy`] gives exactly `from_utf8_lossy` of the whole.
pub(crate) fn drain_utf8(buf: &mut Vec<u8>, out: &mut String) {
    let mut consumed = 0;
    loop {
        match std::str::from_utf8(&buf[consumed..]) {
            Ok(s) => {
                out.push_str(s);
                consumed = buf.len();
                break;
            }
            Err(e) => {
                let valid = consumed + e.valid_up_to();
                // Validated just above, so this borrows without replacing anything.
                out.push_str(&String::from_utf8_lossy(&buf[consumed..valid]));
                match e.error_len() {
                    Some(n) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        consumed = valid + n;
                    }
                    None => {
                        consumed = valid;
                        break;
                    }
                }
            }
        }
    }
    buf.drain(..consumed);
}

/// Empties `buf` at end of stream: an incomplete trailing character becomes one U+FFFD.
pub(crate) fn flush_lossy(buf: &mut Vec<u8>, out: &mut String) {
    drain_utf8(buf, out);
    if !buf.is_empty() {
        out.push(char::REPLACEMENT_CHARACTER);
        buf.clear();
    }
}

/// Options for [`Tokenizer::decode_with`] and [`TokenStreamDecoder`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Render CONTROL and UNKNOWN tokens (`<|im_end|>`, `<eos>`...) as nothing, as
    /// llama-server does for generated text. User-defined tokens are always rendered.
    pub skip_special: bool,
}

/// Incremental detokenizer: push ids as they are generated, get back the text that became
/// complete. Bytes of a character split across tokens are held until the character is whole,
/// so no output ever contains a broken character; the concatenation of every [`push`] and the
/// final [`finish`] equals [`Tokenizer::decode_with`] of the whole sequence.
///
/// [`push`]: TokenStreamDecoder::push
/// [`finish`]: TokenStreamDecoder::finish
pub struct TokenStreamDecoder {
    tokenizer: Tokenizer,
    options: DecodeOptions,
    pending: Vec<u8>,
}

impl TokenStreamDecoder {
    pub(crate) fn new(tokenizer: Tokenizer, options: DecodeOptions) -> TokenStreamDecoder {
        TokenStreamDecoder {
            tokenizer,
            options,
            pending: Vec::new(),
        }
    }

    /// Adds one token; returns the text completed by it (often empty for byte tokens).
    pub fn push(&mut self, id: u32) -> Result<String> {
        let _span = tracing::trace_span!("detokenize", tokens = 1).entered();
        let piece = self.tokenizer.checked_piece(id, self.options)?;
        self.pending.extend_from_slice(piece);
        let mut out = String::new();
        drain_utf8(&mut self.pending, &mut out);
        Ok(out)
    }

    /// Bytes held back because they do not yet form a whole character.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }

    /// Ends the stream: bytes still held (a character the model never finished) come out as
    /// one U+FFFD, as a lossy decode of the whole sequence would show them.
    pub fn finish(&mut self) -> String {
        let mut out = String::new();
        flush_lossy(&mut self.pending, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_alphabet_roundtrip() {
        let table = Gpt2Alphabet::new();
        assert_eq!(table.0.iter().flatten().count(), 256);
        assert_eq!(table.byte('Ġ'), Some(b' '));
        assert_eq!(table.byte('Ċ'), Some(b'\n'));
        assert_eq!(table.byte('a'), Some(b'a'));
        assert_eq!(table.byte(' '), None);
        assert_eq!(byte_level_piece("ĠHello", &table), b" Hello");
        assert_eq!(
            byte_level_piece("x€", &table),
            b"x[UNK_BYTE_0xe282acx\xe2\x82\xac]"
        );
    }

    #[test]
    fn byte_tokens() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(10));
        assert_eq!(parse_byte_token("<0xff>"), Some(255));
        assert_eq!(parse_byte_token("<0x0>"), None);
        assert_eq!(parse_byte_token("0x0A"), None);
    }

    /// Every way of chunking a byte string through drain/flush equals from_utf8_lossy.
    #[test]
    fn chunked_drain_matches_lossy() {
        let samples: [&[u8]; 5] = [
            "a🚀b東".as_bytes(),
            b"\xf0\x9f\x9a",       // truncated emoji
            b"x\xff\xfey\xe6\x9d", // invalid bytes, then a truncated char
            b"\xe6\x9d\x41\xf0\x9f\x9a\x80",
            b"",
        ];
        for bytes in samples {
            let expect = String::from_utf8_lossy(bytes).into_owned();
            for chunk in 1..=4 {
                let (mut buf, mut out) = (Vec::new(), String::new());
                for part in bytes.chunks(chunk) {
                    buf.extend_from_slice(part);
                    drain_utf8(&mut buf, &mut out);
                    assert!(buf.len() < 4, "held back more than one partial character");
                }
                flush_lossy(&mut buf, &mut out);
                assert_eq!(out, expect, "bytes {bytes:?} in chunks of {chunk}");
            }
        }
    }
}
