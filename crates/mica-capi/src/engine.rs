//! `mica_engine`: many concurrent requests on one model, continuously batched on the
//! engine's own thread (what `mica serve` runs). Any number of threads may call
//! `mica_engine_generate()` on one engine at once; each call blocks its thread, streams its
//! own text to its own callback, and cancels its request when the callback asks to stop.

use crate::error::{Failure, MicaStatus, Result, guard, guard_value};
use crate::ffi::{handle, malloc_string, out_arg, slice_arg};
use crate::model::MicaModel;
use crate::params::{
    MicaCompletion, MicaGenerateParams, MicaOnText, Outcome, TextSink, empty_completion,
};
use facade::{Engine, EngineOptions, Event, FinishReason, Request};
use std::ffi::{c_char, c_void};
use std::time::Instant;

/// A running serving engine.
pub struct MicaEngine {
    engine: Engine,
}

/// How to start an engine. Start from `mica_engine_options_default()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MicaEngineOptions {
    /// Positions one request may reach; 0: the model's training context, at most 4096.
    pub n_ctx: usize,
    /// Compute threads; 0: the machine's physical cores.
    pub n_threads: usize,
    /// Memory for the KV cache shared by all requests, in bytes; 0: 512 MiB.
    pub kv_bytes: usize,
    /// Requests that may wait before new ones are refused with `MICA_STATUS_QUEUE_FULL`;
    /// 0: 256.
    pub max_waiting: usize,
    /// Reuse the keys and values of prompt prefixes seen before.
    pub prefix_caching: bool,
}

impl Default for MicaEngineOptions {
    fn default() -> Self {
        let d = EngineOptions::default();
        MicaEngineOptions {
            n_ctx: 0,
            n_threads: 0,
            kv_bytes: d.kv_bytes,
            max_waiting: d.max_waiting_per_lane,
            prefix_caching: d.prefix_caching,
        }
    }
}

impl MicaEngineOptions {
    fn to_facade(self) -> EngineOptions {
        let d = EngineOptions::default();
        EngineOptions {
            n_ctx: (self.n_ctx > 0).then_some(self.n_ctx),
            threads: (self.n_threads > 0).then_some(self.n_threads),
            kv_bytes: if self.kv_bytes > 0 {
                self.kv_bytes
            } else {
                d.kv_bytes
            },
            max_waiting_per_lane: if self.max_waiting > 0 {
                self.max_waiting
            } else {
                d.max_waiting_per_lane
            },
            prefix_caching: self.prefix_caching,
            ..d
        }
    }
}

/// Streams one request's events to `sink` until it ends or the callback stops it.
fn run_request(
    engine: &Engine,
    prompt: &[u32],
    params: facade::GenerateParams,
    sink: &mut TextSink,
) -> Result<Outcome> {
    let start = Instant::now();
    let mut first_token = None;
    let stream = engine.submit(Request::new(prompt.to_vec(), params))?;
    let mut out = Outcome {
        text: String::new(),
        tokens: Vec::new(),
        finish: FinishReason::Cancelled,
        prompt_tokens: prompt.len(),
        cached_tokens: 0,
        prompt_ms: 0.0,
        generation_ms: 0.0,
    };
    let mut stopped = false;
    for ev in stream {
        match ev {
            Event::Token { token, text, .. } => {
                first_token.get_or_insert_with(Instant::now);
                out.tokens.push(token);
                out.text.push_str(&text);
                if !sink.send(&text) {
                    // Leaving the loop drops the stream, which cancels the request and
                    // frees its KV blocks at the engine's next step.
                    stopped = true;
                    break;
                }
            }
            Event::Done { finish, text, .. } => {
                out.text.push_str(&text);
                out.finish = finish;
                if !sink.send(&text) {
                    out.finish = FinishReason::Cancelled;
                }
            }
            Event::Finished { usage } => {
                out.prompt_tokens = usage.prompt_tokens;
                out.cached_tokens = usage.cached_tokens;
                break;
            }
            Event::Error(e) => return Err(facade::Error::from(e).into()),
        }
    }
    if stopped {
        out.finish = FinishReason::Cancelled;
    }
    let end = Instant::now();
    let first = first_token.unwrap_or(end);
    out.prompt_ms = (first - start).as_secs_f64() * 1e3;
    out.generation_ms = (end - first).as_secs_f64() * 1e3;
    Ok(out)
}

/// The default engine options: the model's context (at most 4096), all physical cores,
/// 512 MiB of KV cache, 256 waiting requests, prefix caching on.
///
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn mica_engine_options_default() -> MicaEngineOptions {
    MicaEngineOptions::default()
}

/// Starts an engine on `model` (which may be freed before the engine), on a thread of its
/// own. On success `*out` is a handle to free with `mica_engine_free()`; on failure NULL.
///
/// Thread-safe.
///
/// # Safety
/// `model` is NULL or a live handle; `options` is NULL (the defaults) or valid; `out` is
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_engine_start(
    model: *const MicaModel,
    options: *const MicaEngineOptions,
    out: *mut *mut MicaEngine,
) -> MicaStatus {
    guard(|| {
        out_arg(out, "out")?;
        // SAFETY: writable by the contract; cleared first so a failure leaves NULL.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: NULL or live by the contract.
        let m = unsafe { handle(model, "model") }?;
        // SAFETY: NULL or valid by the contract.
        let o = unsafe { options.as_ref() }.copied().unwrap_or_default();
        let engine = m.model.engine(o.to_facade())?;
        // SAFETY: checked above.
        unsafe { out.write(Box::into_raw(Box::new(MicaEngine { engine }))) };
        Ok(())
    })
}

/// Stops the engine and frees it (NULL is fine). Requests still running end with
/// `MICA_STATUS_ENGINE_STOPPED`.
///
/// Not thread-safe with other calls on the same engine: free it once every
/// `mica_engine_generate()` on it has returned.
///
/// # Safety
/// `engine` is NULL or a handle from `mica_engine_start()` not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_engine_free(engine: *mut MicaEngine) {
    if engine.is_null() {
        return;
    }
    guard(|| {
        // SAFETY: a live handle from Box::into_raw, by the contract.
        drop(unsafe { Box::from_raw(engine) });
        Ok(())
    });
}

/// Positions one request may reach (capped at what the KV memory holds). 0 when `engine`
/// is NULL.
///
/// Thread-safe.
///
/// # Safety
/// `engine` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_engine_n_ctx(engine: *const MicaEngine) -> usize {
    // SAFETY: NULL or live by the contract.
    guard_value(0, || {
        Ok(unsafe { handle(engine, "engine") }?.engine.n_ctx())
    })
}

/// Generates a continuation of `prompt` as `mica_session_generate()` does, as one request
/// among any others the engine is running. Greedy requests give the same tokens as a
/// session. A full queue is `MICA_STATUS_QUEUE_FULL`. The completion's `prompt_ms` is the
/// time to the first token, queueing included.
///
/// Thread-safe: call it from as many threads at once as there are requests to run; each
/// call blocks its own thread, and its callback runs on that thread.
///
/// # Safety
/// `engine` is NULL or a live handle; `prompt` is NULL or holds `n_prompt` elements;
/// `params` is NULL or valid (its arrays as documented there); `on_text` is NULL or a
/// function following `mica_on_text`'s contract; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_engine_generate(
    engine: *const MicaEngine,
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
        // SAFETY: NULL or live by the contract.
        let e = unsafe { handle(engine, "engine") }?;
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
        let outcome = run_request(&e.engine, prompt, params, &mut sink)?;
        // SAFETY: NULL or writable by the contract.
        unsafe { outcome.write_to(out) }
    })
}

/// The engine's counters and gauges (requests, queue depth, tokens, KV use) in the
/// Prometheus text format, labelled with the model's file name. On success `*out` is a
/// string to free with `mica_string_free()`.
///
/// Thread-safe.
///
/// # Safety
/// `engine` is NULL or a live handle; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_engine_metrics(
    engine: *const MicaEngine,
    out: *mut *mut c_char,
) -> MicaStatus {
    guard(|| {
        out_arg(out, "out")?;
        // SAFETY: writable by the contract; cleared first so a failure leaves NULL.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: NULL or live by the contract.
        let e = unsafe { handle(engine, "engine") }?;
        let path = e.engine.model().path();
        let name = path
            .file_name()
            .map_or_else(|| path.to_string_lossy(), |n| n.to_string_lossy());
        let mut text = String::new();
        e.engine.metrics().render(&name, &mut text);
        let s = malloc_string(text.as_bytes())?;
        // SAFETY: checked above.
        unsafe { out.write(s) };
        Ok(())
    })
}
