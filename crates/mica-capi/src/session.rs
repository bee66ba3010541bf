//! `mica_session`: one sequence at a time on its own threads and KV cache — streaming
//! generation and raw logits. A session is used by one thread at a time (it may move
//! between threads); for concurrent requests use a `mica_engine`.

use crate::error::{Failure, MicaStatus, Result, guard, guard_value};
use crate::ffi::{handle, handle_mut, out_arg, slice_arg, too_small, write_buffer};
use crate::model::MicaModel;
use crate::params::{
    MicaCompletion, MicaGenerateParams, MicaOnText, Outcome, TextSink, empty_completion,
};
use facade::{Model, Session, SessionOptions};
use std::ffi::c_void;

/// A model with a thread pool, a KV cache and buffers, for one sequence.
pub struct MicaSession {
    session: Session,
    model: Model,
    /// Set when a call panicked mid-way: the cache may no longer match the tokens it
    /// claims to hold, so every later call is refused.
    poisoned: bool,
}

/// How to make a session. Start from `mica_session_options_default()`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MicaSessionOptions {
    /// Positions the session holds (prompt and generated tokens); 0: the model's training
    /// context, at most 4096.
    pub n_ctx: usize,
    /// Compute threads; 0: the machine's physical cores.
    pub n_threads: usize,
}

impl MicaSession {
    /// Runs `body` on the session unless an earlier call panicked; poisons it when this one
    /// panics.
    pub(crate) fn run<T>(&mut self, body: impl FnOnce(&mut MicaSession) -> Result<T>) -> Result<T> {
        if self.poisoned {
            return Err(Failure::new(
                MicaStatus::Internal,
                "this session hit an internal error in an earlier call; free it and make a new one",
            ));
        }
        self.poisoned = true;
        let out = body(self);
        // Reached only when `body` returned (a panic unwinds past this line).
        self.poisoned = false;
        out
    }
}

/// The default session options: the model's context (at most 4096), all physical cores.
///
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn mica_session_options_default() -> MicaSessionOptions {
    MicaSessionOptions::default()
}

/// Makes a session on `model` (which may be freed before the session). On success `*out`
/// is a handle to free with `mica_session_free()`; on failure NULL.
///
/// Thread-safe (sessions on one model may run at the same time, each on its own threads).
///
/// # Safety
/// `model` is NULL or a live handle; `options` is NULL (the defaults) or valid; `out` is
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_session_new(
    model: *const MicaModel,
    options: *const MicaSessionOptions,
    out: *mut *mut MicaSession,
) -> MicaStatus {
    guard(|| {
        out_arg(out, "out")?;
        // SAFETY: writable by the contract; cleared first so a failure leaves NULL.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: NULL or live by the contract.
        let m = unsafe { handle(model, "model") }?;
        // SAFETY: NULL or valid by the contract.
        let o = unsafe { options.as_ref() }.copied().unwrap_or_default();
        let opts = SessionOptions {
            n_ctx: (o.n_ctx > 0).then_some(o.n_ctx),
            threads: (o.n_threads > 0).then_some(o.n_threads),
        };
        let s = MicaSession {
            session: m.model.session(opts),
            model: m.model.clone(),
            poisoned: false,
        };
        // SAFETY: checked above.
        unsafe { out.write(Box::into_raw(Box::new(s))) };
        Ok(())
    })
}

/// Frees a session (NULL is fine).
///
/// Not thread-safe with other calls on the same session.
///
/// # Safety
/// `session` is NULL or a handle from `mica_session_new()` not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_session_free(session: *mut MicaSession) {
    if session.is_null() {
        return;
    }
    guard(|| {
        // SAFETY: a live handle from Box::into_raw, by the contract.
        drop(unsafe { Box::from_raw(session) });
        Ok(())
    });
}

/// Positions the session holds. 0 when `session` is NULL.
///
/// Not thread-safe with other calls on the same session.
///
/// # Safety
/// `session` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_session_n_ctx(session: *const MicaSession) -> usize {
    // SAFETY: NULL or live by the contract.
    guard_value(0, || {
        Ok(unsafe { handle(session, "session") }?.session.n_ctx())
    })
}

/// Generates a continuation of the `n_prompt` token ids at `prompt` (from `mica_tokenize()`
/// or `mica_chat_prompt()`). `params` NULL means `mica_generate_params_default()`. The text
/// goes to `on_text` as it becomes final (NULL: no streaming); a nonzero return from it
/// stops generation, and the call still succeeds, with `MICA_FINISH_REASON_CANCELLED`.
/// When `out` is not NULL it receives the completion (free it with
/// `mica_completion_free()`); after a failure it holds an empty one.
///
/// The session keeps what it computed: a prompt that extends the previous prompt and its
/// answer (a chat's next turn) evaluates only the new tokens.
///
/// Not thread-safe with other calls on the same session; the callback runs on the calling
/// thread.
///
/// # Safety
/// `session` is NULL or a live handle; `prompt` is NULL or holds `n_prompt` elements;
/// `params` is NULL or valid (its arrays as documented there); `on_text` is NULL or a
/// function following `mica_on_text`'s contract; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_session_generate(
    session: *mut MicaSession,
    prompt: *const u32,
    n_prompt: usize,
    params: *const MicaGenerateParams,
    on_text: MicaOnText,
    user: *mut c_void,
    out: *mut MicaCompletion,
) -> MicaStatus {
    guard(|| {
        if !out.is_null() {
            // SAFETY: writable by the contract.
            unsafe { out.write(empty_completion()) };
        }
        // SAFETY: NULL or live, used by this thread only, by the contract.
        let s = unsafe { handle_mut(session, "session") }?;
        // SAFETY: `n_prompt` elements by the contract.
        let prompt = unsafe { slice_arg(prompt, n_prompt, "prompt") }?;
        if prompt.is_empty() {
            return Err(Failure::invalid("the prompt is empty"));
        }
        // SAFETY: NULL or valid by the contract.
        let p = unsafe { params.as_ref() }.copied().unwrap_or_default();
        // SAFETY: the parameters' arrays are valid by the contract.
        let params = unsafe { p.to_facade() }?;
        let mut sink = TextSink::new(on_text, user);
        let g = s.run(|s| Ok(s.session.stream(prompt, &params, |t| sink.send(t))?))?;
        let t = g.timings;
        let outcome = Outcome {
            text: g.text,
            tokens: g.output_ids,
            finish: g.finish,
            prompt_tokens: prompt.len(),
            cached_tokens: prompt.len().saturating_sub(t.prompt_tokens),
            prompt_ms: t.prompt_time.as_secs_f64() * 1e3,
            generation_ms: t.gen_time.as_secs_f64() * 1e3,
        };
        // SAFETY: NULL or writable by the contract.
        unsafe { outcome.write_to(out) }
    })
}

/// The logits of the token that would follow the `n_tokens` ids at `tokens`, evaluated
/// from an empty cache: `n_vocab` floats (`mica_model_n_vocab()`), or with `all_positions`
/// those after every token (`n_tokens * n_vocab`, row-major). They go to `out` (room for
/// `capacity` floats); `*n_out` receives the count needed, and when it exceeds `capacity`
/// nothing is computed and the status is `MICA_STATUS_BUFFER_TOO_SMALL`.
///
/// Not thread-safe with other calls on the same session.
///
/// # Safety
/// `session` is NULL or a live handle; `tokens` is NULL or holds `n_tokens` elements;
/// `out` is NULL or holds `capacity` elements; `n_out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_session_logits(
    session: *mut MicaSession,
    tokens: *const u32,
    n_tokens: usize,
    all_positions: bool,
    out: *mut f32,
    capacity: usize,
    n_out: *mut usize,
) -> MicaStatus {
    guard(|| {
        out_arg(n_out, "n_out")?;
        // SAFETY: NULL or live, used by this thread only, by the contract.
        let s = unsafe { handle_mut(session, "session") }?;
        // SAFETY: `n_tokens` elements by the contract.
        let tokens = unsafe { slice_arg(tokens, n_tokens, "tokens") }?;
        if tokens.is_empty() {
            return Err(Failure::invalid("no tokens to evaluate"));
        }
        let n_vocab = s.model.n_vocab();
        let needed = if all_positions {
            tokens
                .len()
                .checked_mul(n_vocab)
                .ok_or_else(|| Failure::invalid("n_tokens * n_vocab overflows"))?
        } else {
            n_vocab
        };
        // SAFETY: checked above.
        unsafe { n_out.write(needed) };
        if needed > capacity {
            return Err(too_small("out", needed, capacity));
        }
        let logits = s.run(|s| {
            Ok(if all_positions {
                s.session.logits_all(tokens)?
            } else {
                s.session.logits(tokens)?
            })
        })?;
        // SAFETY: `n_out` checked; `out` holds `capacity >= needed` elements.
        unsafe { write_buffer(&logits, out, capacity, n_out, "out") }
    })
}
