//! Generation parameters as a plain C struct (filled by `mica_generate_params_default()`,
//! then changed field by field), and what a generation hands back: the streaming
//! callback's type and `mica_completion`.

use crate::error::Result;
use crate::ffi::{malloc_array, malloc_string, slice_arg, str_arg};
use facade::{FinishReason, GenerateParams, SamplingParams};
use std::ffi::{c_char, c_int, c_void};
use std::ptr::addr_of_mut;

/// A bias added to one token's logit before the penalties and the sampler.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MicaLogitBias {
    pub token: u32,
    /// Finite; `-100` or less all but bans the token.
    pub bias: f32,
}

/// How to generate. Start from `mica_generate_params_default()` so that fields added in a
/// later ABI version get their defaults.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MicaGenerateParams {
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// 0 (or less) is greedy decoding; otherwise the softmax temperature.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p`; 1 disables.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 disables.
    pub min_p: f32,
    /// Divides positive / multiplies negative logits of recent tokens; 1 disables.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every recent token; 0 disables.
    pub presence_penalty: f32,
    /// Subtracted per occurrence from recent tokens' logits; 0 disables.
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub penalty_last_n: usize,
    /// The sampler's seed: the same seed and parameters give the same text.
    pub seed: u64,
    /// Keep generating past end-of-generation tokens.
    pub ignore_eos: bool,
    /// `n_stop` UTF-8 strings; generation ends before the first of them (which is not in
    /// the text). May be NULL when `n_stop` is 0. Read during the call only.
    pub stop: *const *const c_char,
    pub n_stop: usize,
    /// `n_logit_bias` biases; may be NULL when `n_logit_bias` is 0. Read during the call
    /// only.
    pub logit_bias: *const MicaLogitBias,
    pub n_logit_bias: usize,
    /// Locally typical sampling's mass; 1 disables.
    pub typical_p: f32,
    /// XTC: the chance per token of removing every token at least `xtc_threshold` likely
    /// but the least likely of them; 0 disables.
    pub xtc_probability: f32,
    pub xtc_threshold: f32,
    /// DRY: penalty multiplier for tokens that would extend a repeated sequence; 0
    /// disables.
    pub dry_multiplier: f32,
    /// DRY: the penalty grows by this factor per repeated token (at least 1).
    pub dry_base: f32,
    /// DRY: repeats up to this long go unpenalized.
    pub dry_allowed_length: u32,
    /// DRY: how many recent tokens it looks at; -1 the whole context, 0 disables.
    pub dry_penalty_last_n: i32,
    /// DRY: `n_dry_sequence_breakers` UTF-8 strings that end a repeat; NULL with 0 means
    /// llama.cpp's defaults ("\n", ":", "\"", "*"). Read during the call only.
    pub dry_sequence_breakers: *const *const c_char,
    pub n_dry_sequence_breakers: usize,
}

impl Default for MicaGenerateParams {
    fn default() -> Self {
        let g = GenerateParams::default();
        let s = g.sampling;
        MicaGenerateParams {
            max_tokens: g.max_tokens,
            temperature: s.temperature,
            top_k: s.top_k,
            top_p: s.top_p,
            min_p: s.min_p,
            repeat_penalty: s.repeat_penalty,
            presence_penalty: s.presence_penalty,
            frequency_penalty: s.frequency_penalty,
            penalty_last_n: s.penalty_last_n,
            seed: s.seed,
            ignore_eos: g.ignore_eos,
            stop: std::ptr::null(),
            n_stop: 0,
            logit_bias: std::ptr::null(),
            n_logit_bias: 0,
            typical_p: s.typical_p,
            xtc_probability: s.xtc_probability,
            xtc_threshold: s.xtc_threshold,
            dry_multiplier: s.dry_multiplier,
            dry_base: s.dry_base,
            dry_allowed_length: s.dry_allowed_length,
            dry_penalty_last_n: s.dry_penalty_last_n,
            dry_sequence_breakers: std::ptr::null(),
            n_dry_sequence_breakers: 0,
        }
    }
}

impl MicaGenerateParams {
    /// The facade's parameters (range checks happen where they are used, naming the
    /// parameter at fault).
    ///
    /// # Safety
    /// `stop`, `logit_bias` and `dry_sequence_breakers` are NULL or hold `n_stop` /
    /// `n_logit_bias` / `n_dry_sequence_breakers` elements, each string NULL or
    /// NUL-terminated.
    pub(crate) unsafe fn to_facade(self) -> Result<GenerateParams> {
        // SAFETY: forwarded contract.
        let stops = unsafe { slice_arg(self.stop, self.n_stop, "params->stop") }?;
        let mut stop = Vec::with_capacity(stops.len());
        for (i, &s) in stops.iter().enumerate() {
            // SAFETY: forwarded contract.
            let s = unsafe { str_arg(s, &format!("params->stop[{i}]")) }?;
            stop.push(s.to_string());
        }
        // SAFETY: forwarded contract.
        let bias = unsafe { slice_arg(self.logit_bias, self.n_logit_bias, "params->logit_bias") }?;
        // SAFETY: forwarded contract.
        let breakers = unsafe {
            slice_arg(
                self.dry_sequence_breakers,
                self.n_dry_sequence_breakers,
                "params->dry_sequence_breakers",
            )
        }?;
        let mut dry_sequence_breakers = Vec::with_capacity(breakers.len());
        for (i, &s) in breakers.iter().enumerate() {
            // SAFETY: forwarded contract.
            let s = unsafe { str_arg(s, &format!("params->dry_sequence_breakers[{i}]")) }?;
            dry_sequence_breakers.push(s.to_string());
        }
        if dry_sequence_breakers.is_empty() {
            dry_sequence_breakers = SamplingParams::default().dry_sequence_breakers;
        }
        Ok(GenerateParams {
            max_tokens: self.max_tokens,
            sampling: SamplingParams {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repeat_penalty: self.repeat_penalty,
                presence_penalty: self.presence_penalty,
                frequency_penalty: self.frequency_penalty,
                penalty_last_n: self.penalty_last_n,
                seed: self.seed,
                // The C API does not expose mirostat.
                mirostat: None,
                typical_p: self.typical_p,
                xtc_probability: self.xtc_probability,
                xtc_threshold: self.xtc_threshold,
                dry_multiplier: self.dry_multiplier,
                dry_base: self.dry_base,
                dry_allowed_length: self.dry_allowed_length,
                dry_penalty_last_n: self.dry_penalty_last_n,
                dry_sequence_breakers,
            },
            stop,
            ignore_eos: self.ignore_eos,
            logit_bias: bias.iter().map(|b| (b.token, b.bias)).collect(),
        })
    }
}

/// Receives generated text as it becomes final: `len` bytes of UTF-8 at `text` (whole
/// characters, never part of a stop string), followed by a NUL. `text` is valid only
/// during the call. Return 0 to go on, nonzero to stop generating (the completion then
/// ends with `MICA_FINISH_REASON_CANCELLED`). It runs on the thread that called the
/// generating function and must not call into the same session.
pub type MicaOnText =
    Option<unsafe extern "C" fn(text: *const c_char, len: usize, user: *mut c_void) -> c_int>;

/// Calls a [`MicaOnText`] with NUL-terminated copies of the pieces (reusing one buffer).
pub(crate) struct TextSink {
    on_text: MicaOnText,
    user: *mut c_void,
    buf: Vec<u8>,
}

impl TextSink {
    pub(crate) fn new(on_text: MicaOnText, user: *mut c_void) -> TextSink {
        TextSink {
            on_text,
            user,
            buf: Vec::new(),
        }
    }

    /// Hands `piece` to the callback; false when it asked to stop.
    pub(crate) fn send(&mut self, piece: &str) -> bool {
        let Some(f) = self.on_text else {
            return true;
        };
        if piece.is_empty() {
            return true;
        }
        self.buf.clear();
        self.buf.extend_from_slice(piece.as_bytes());
        self.buf.push(0);
        // SAFETY: the callback's contract: it reads `len` bytes (plus the NUL) during the
        // call; `user` is the caller's own pointer, passed back untouched.
        unsafe { f(self.buf.as_ptr().cast(), piece.len(), self.user) == 0 }
    }
}

/// Why a completion ended.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MicaFinishReason {
    /// An end-of-generation token (in `tokens`, not in `text`).
    Eos = 0,
    /// A stop string (neither it nor what follows is in `text`).
    Stop = 1,
    /// `max_tokens` reached.
    Length = 2,
    /// The context is full.
    Context = 3,
    /// The callback asked to stop.
    Cancelled = 4,
    /// The output constraint (a grammar) allows no further token.
    Constraint = 5,
}

impl From<FinishReason> for MicaFinishReason {
    fn from(f: FinishReason) -> Self {
        match f {
            FinishReason::Eos => MicaFinishReason::Eos,
            FinishReason::Stop => MicaFinishReason::Stop,
            FinishReason::Length => MicaFinishReason::Length,
            FinishReason::Context => MicaFinishReason::Context,
            FinishReason::Cancelled => MicaFinishReason::Cancelled,
            FinishReason::Constraint => MicaFinishReason::Constraint,
        }
    }
}

/// A finished generation. `text` and `tokens` belong to the caller, who releases them with
/// `mica_completion_free()` (not `mica_string_free()`); do not change `text`, `tokens` or
/// their lengths before that.
#[repr(C)]
#[derive(Debug)]
pub struct MicaCompletion {
    /// The generated text, UTF-8, `text_len` bytes followed by a NUL (it may contain NUL
    /// bytes if the model generated them; `text_len` is authoritative).
    pub text: *mut c_char,
    pub text_len: usize,
    /// The generated token ids (an end-of-generation token included); NULL when
    /// `n_tokens` is 0.
    pub tokens: *mut u32,
    pub n_tokens: usize,
    pub finish: MicaFinishReason,
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys and values were reused (a session's cached prefix, an
    /// engine's prefix cache) instead of being computed.
    pub cached_tokens: usize,
    /// Milliseconds spent on the prompt (for an engine: from submitting to the first
    /// token, queueing included).
    pub prompt_ms: f64,
    /// Milliseconds spent generating after the prompt.
    pub generation_ms: f64,
}

/// What a generation produced, before it is copied into C memory.
pub(crate) struct Outcome {
    pub(crate) text: String,
    pub(crate) tokens: Vec<u32>,
    pub(crate) finish: FinishReason,
    pub(crate) prompt_tokens: usize,
    pub(crate) cached_tokens: usize,
    pub(crate) prompt_ms: f64,
    pub(crate) generation_ms: f64,
}

impl Outcome {
    /// Writes the outcome to `*out` (when `out` is not NULL).
    ///
    /// # Safety
    /// `out` is NULL or points to writable memory for a [`MicaCompletion`].
    pub(crate) unsafe fn write_to(self, out: *mut MicaCompletion) -> Result<()> {
        if out.is_null() {
            return Ok(());
        }
        let text = malloc_string(self.text.as_bytes())?;
        let tokens = match malloc_array(&self.tokens) {
            Ok(t) => t,
            Err(e) => {
                // SAFETY: allocated just above with malloc.
                unsafe { libc::free(text.cast()) };
                return Err(e);
            }
        };
        let c = MicaCompletion {
            text,
            text_len: self.text.len(),
            tokens,
            n_tokens: self.tokens.len(),
            finish: self.finish.into(),
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            prompt_ms: self.prompt_ms,
            generation_ms: self.generation_ms,
        };
        // SAFETY: writable by the caller's contract; `write` does not read the old value.
        unsafe { out.write(c) };
        Ok(())
    }
}

/// An empty completion (what `out` holds after a failed call).
pub(crate) fn empty_completion() -> MicaCompletion {
    MicaCompletion {
        text: std::ptr::null_mut(),
        text_len: 0,
        tokens: std::ptr::null_mut(),
        n_tokens: 0,
        finish: MicaFinishReason::Eos,
        prompt_tokens: 0,
        cached_tokens: 0,
        prompt_ms: 0.0,
        generation_ms: 0.0,
    }
}

/// The default generation parameters: 128 tokens, llama.cpp's sampling chain and defaults
/// (top-k 40, top-p 0.95, min-p 0.05, temperature 0.8), seed 0, no stop strings. Set
/// `temperature` to 0 for greedy decoding.
///
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn mica_generate_params_default() -> MicaGenerateParams {
    MicaGenerateParams::default()
}

/// Frees the text and tokens of a completion and zeroes those fields; the struct itself
/// belongs to the caller. NULL, a zeroed completion, and one freed already are fine.
///
/// Thread-safe for distinct completions.
///
/// # Safety
/// `completion` is NULL or points to a completion filled by mica (or zeroed), whose `text`
/// and `tokens` were not changed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_completion_free(completion: *mut MicaCompletion) {
    if completion.is_null() {
        return;
    }
    // Only the two pointer fields are touched (through raw places, so that whatever the
    // other fields hold is never read as a Rust value).
    // SAFETY: not NULL; the pointers came from malloc (or are NULL) by the contract.
    unsafe {
        let text = addr_of_mut!((*completion).text);
        libc::free(text.read().cast());
        text.write(std::ptr::null_mut());
        addr_of_mut!((*completion).text_len).write(0);
        let tokens = addr_of_mut!((*completion).tokens);
        libc::free(tokens.read().cast());
        tokens.write(std::ptr::null_mut());
        addr_of_mut!((*completion).n_tokens).write(0);
    }
}
