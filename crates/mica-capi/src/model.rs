//! `mica_model`: opening a model (a path, or a name in a model store) and what needs only
//! the model — tokenizing, detokenizing, chat prompts. A model is immutable once open, so
//! every function here is thread-safe.

use crate::error::{Failure, MicaStatus, Result, guard, guard_value};
use crate::ffi::{handle, malloc_string, opt_str_arg, out_arg, slice_arg, str_arg, write_buffer};
use facade::hub::{Event, Progress};
use facade::{ChatMessage, Hub, HubConfig, Model, ModelOptions, Store};
use std::cell::Cell;
use std::ffi::{CString, c_char, c_void};
use std::path::Path;

/// An open model: weights, tokenizer and chat template. Sessions and engines made from it
/// share its weights and keep them alive, so it may be freed before them.
pub struct MicaModel {
    pub(crate) model: Model,
}

/// Receives what opening a model by name does: a status line for a person (`done` and
/// `total` 0), or a transfer's progress (`message` is its phase, "pulling", "verifying"…;
/// `done` bytes of `total`, `total` 0 when unknown). `message` is valid during the call
/// only. It runs on the thread that called `mica_model_open`.
pub type MicaOnProgress =
    Option<unsafe extern "C" fn(message: *const c_char, done: u64, total: u64, user: *mut c_void)>;

/// How to open a model. Start from `mica_model_options_default()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MicaModelOptions {
    /// A model store directory (as `mica`'s `$MICA_HOME/models`) in which names are looked
    /// up; NULL: `path_or_name` must be a path.
    pub store_dir: *const c_char,
    /// Pull a catalog name or `hf:ORG/REPO[:FILE]` into `store_dir` when it is not there
    /// yet (a network download); false: only models already in the store are found.
    pub allow_pull: bool,
    /// The hub's base URL for pulls; NULL: the public hub.
    pub hub_endpoint: *const c_char,
    /// An access token for gated repositories; NULL: none.
    pub hub_token: *const c_char,
    /// Repack the weights into this CPU's fastest layouts at load (same results, faster;
    /// reads the whole file up front).
    pub repack: bool,
    /// Progress of a pull; NULL: none.
    pub on_progress: MicaOnProgress,
    /// Passed to `on_progress` untouched.
    pub progress_user: *mut c_void,
}

impl Default for MicaModelOptions {
    fn default() -> Self {
        MicaModelOptions {
            store_dir: std::ptr::null(),
            allow_pull: false,
            hub_endpoint: std::ptr::null(),
            hub_token: std::ptr::null(),
            repack: ModelOptions::default().repack,
            on_progress: None,
            progress_user: std::ptr::null_mut(),
        }
    }
}

/// One conversation message. Both strings are UTF-8, NUL-terminated, read during the call
/// only.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MicaChatMessage {
    /// "system", "user", "assistant", …
    pub role: *const c_char,
    pub content: *const c_char,
}

/// Forwards the store's progress events to a [`MicaOnProgress`].
struct ProgressSink {
    f: unsafe extern "C" fn(*const c_char, u64, u64, *mut c_void),
    user: *mut c_void,
    /// The current transfer: its phase, bytes done, bytes in all.
    phase: Cell<&'static str>,
    done: Cell<u64>,
    total: Cell<u64>,
}

impl ProgressSink {
    fn call(&self, message: &str, done: u64, total: u64) {
        let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
        // SAFETY: the callback's contract: `message` is read during the call; `user` is the
        // caller's own pointer, passed back untouched.
        unsafe { (self.f)(c.as_ptr(), done, total, self.user) };
    }
}

impl Progress for ProgressSink {
    fn event(&self, event: Event<'_>) {
        match event {
            Event::Status(s) => self.call(s, 0, 0),
            Event::Start { phase, total, done } => {
                self.phase.set(phase.as_str());
                self.done.set(done);
                self.total.set(total.unwrap_or(0));
                self.call(phase.as_str(), done, total.unwrap_or(0));
            }
            Event::Advance(n) => {
                self.done.set(self.done.get().saturating_add(n));
                self.call(self.phase.get(), self.done.get(), self.total.get());
            }
            Event::Finish => self.call(self.phase.get(), self.done.get(), self.total.get()),
        }
    }
}

/// Opens what `path_or_name` names: an existing path as it is; else, with a store, a model
/// in it; else, when pulls are allowed, a catalog or hub name pulled first.
fn open(path_or_name: &str, opts: &MicaModelOptions) -> Result<Model> {
    let model_opts = ModelOptions {
        repack: opts.repack,
        ..ModelOptions::default()
    };
    // SAFETY: the options' strings are NULL or NUL-terminated (mica_model_open's contract).
    let store_dir = unsafe { opt_str_arg(opts.store_dir, "options->store_dir") }?;
    let Some(store_dir) = store_dir else {
        return Ok(Model::open_with(path_or_name, model_opts)?);
    };
    if Path::new(path_or_name).exists() {
        return Ok(Model::open_with(path_or_name, model_opts)?);
    }
    let store = Store::open(store_dir);
    if !opts.allow_pull {
        return match store.find(path_or_name).map_err(facade::Error::from)? {
            Some(m) => Ok(Model::open_with(m.path, model_opts)?),
            None => Err(Failure::new(
                MicaStatus::NotFound,
                format!(
                    "{path_or_name}: no such file, and no model of that name in the store at {store_dir} (pulling is off)"
                ),
            )),
        };
    }
    // SAFETY: as above.
    let endpoint = unsafe { opt_str_arg(opts.hub_endpoint, "options->hub_endpoint") }?;
    // SAFETY: as above.
    let token = unsafe { opt_str_arg(opts.hub_token, "options->hub_token") }?;
    let mut config = HubConfig::default();
    if let Some(e) = endpoint {
        config.endpoint = e.to_string();
    }
    config.token = token.map(str::to_string);
    let hub = Hub::new(config);
    let sink = opts.on_progress.map(|f| ProgressSink {
        f,
        user: opts.progress_user,
        phase: Cell::new(""),
        done: Cell::new(0),
        total: Cell::new(0),
    });
    let progress = sink.as_ref().map(|s| s as &dyn Progress);
    Ok(Model::from_store(
        &store,
        &hub,
        path_or_name,
        progress,
        model_opts,
    )?)
}

/// The default model options: no store (paths only), no pulls, repacking on.
///
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn mica_model_options_default() -> MicaModelOptions {
    MicaModelOptions::default()
}

/// Opens a model: a GGUF or `.mica` file, a Hugging Face folder (config.json, safetensors,
/// tokenizer.json), or — with `options->store_dir` — a model name in that store. On success
/// `*out` is a handle to free with `mica_model_free()`; on failure it is NULL and the
/// status says why (`MICA_STATUS_NOT_FOUND` for a missing file or name,
/// `MICA_STATUS_MODEL_LOAD` for one mica cannot read).
///
/// Thread-safe. Loading reads (and, with `repack`, repacks) the weights: it takes a while
/// for a large model.
///
/// # Safety
/// `path_or_name` is NULL or a NUL-terminated string; `options` is NULL (the defaults) or
/// points to options whose strings are NULL or NUL-terminated; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_model_open(
    path_or_name: *const c_char,
    options: *const MicaModelOptions,
    out: *mut *mut MicaModel,
) -> MicaStatus {
    guard(|| {
        out_arg(out, "out")?;
        // SAFETY: writable by the contract; cleared first so a failure leaves NULL.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: NUL-terminated by the contract.
        let name = unsafe { str_arg(path_or_name, "path_or_name") }?;
        // SAFETY: NULL or valid by the contract.
        let opts = unsafe { options.as_ref() }.copied().unwrap_or_default();
        let model = open(name, &opts)?;
        let h = Box::into_raw(Box::new(MicaModel { model }));
        // SAFETY: checked above.
        unsafe { out.write(h) };
        Ok(())
    })
}

/// Frees a model handle (NULL is fine). Sessions and engines made from it stay usable.
///
/// Not thread-safe with other calls on the same model handle: free it once no thread uses
/// it.
///
/// # Safety
/// `model` is NULL or a handle from `mica_model_open()` not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_model_free(model: *mut MicaModel) {
    if model.is_null() {
        return;
    }
    guard(|| {
        // SAFETY: a live handle from Box::into_raw, by the contract.
        drop(unsafe { Box::from_raw(model) });
        Ok(())
    });
}

/// The vocabulary size: the length of one position's logits. 0 when `model` is NULL.
///
/// Thread-safe.
///
/// # Safety
/// `model` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_model_n_vocab(model: *const MicaModel) -> usize {
    // SAFETY: NULL or live by the contract.
    guard_value(0, || Ok(unsafe { handle(model, "model") }?.model.n_vocab()))
}

/// The context length the model was trained with. 0 when `model` is NULL.
///
/// Thread-safe.
///
/// # Safety
/// `model` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_model_n_ctx_train(model: *const MicaModel) -> usize {
    // SAFETY: NULL or live by the contract.
    guard_value(0, || {
        Ok(unsafe { handle(model, "model") }?.model.n_ctx_train())
    })
}

/// Tokenizes UTF-8 `text` into `out` (room for `capacity` ids). `add_special` adds BOS/EOS
/// where the model asks for them; `parse_special` turns special tokens written in the text
/// (`<|im_start|>`) into those tokens (both true: as llama.cpp tokenizes a prompt).
/// `*n_out` receives the number of ids; when it exceeds `capacity` nothing is written to
/// `out` and the status is `MICA_STATUS_BUFFER_TOO_SMALL` (so `out` NULL, `capacity` 0
/// asks for the size).
///
/// Thread-safe.
///
/// # Safety
/// `model` is NULL or a live handle; `text` is NULL or NUL-terminated; `out` is NULL or
/// holds `capacity` elements; `n_out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_tokenize(
    model: *const MicaModel,
    text: *const c_char,
    add_special: bool,
    parse_special: bool,
    out: *mut u32,
    capacity: usize,
    n_out: *mut usize,
) -> MicaStatus {
    guard(|| {
        out_arg(n_out, "n_out")?;
        // SAFETY: NULL or live by the contract.
        let m = unsafe { handle(model, "model") }?;
        // SAFETY: NUL-terminated by the contract.
        let text = unsafe { str_arg(text, "text") }?;
        let ids = m.model.tokenize_with(text, add_special, parse_special)?;
        // SAFETY: `n_out` checked; `out` holds `capacity` elements by the contract.
        unsafe { write_buffer(&ids, out, capacity, n_out, "out") }
    })
}

/// Turns `n_ids` token ids into text (special tokens as their text). On success `*out` is
/// a NUL-terminated UTF-8 string to free with `mica_string_free()` (an id cut off in the
/// middle of a character gives U+FFFD), and `*out_len` (if not NULL) its length in bytes.
/// An id outside the vocabulary is `MICA_STATUS_INVALID_ARGUMENT`.
///
/// Thread-safe.
///
/// # Safety
/// `model` is NULL or a live handle; `ids` is NULL or holds `n_ids` elements; `out` and
/// `out_len` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_detokenize(
    model: *const MicaModel,
    ids: *const u32,
    n_ids: usize,
    out: *mut *mut c_char,
    out_len: *mut usize,
) -> MicaStatus {
    guard(|| {
        out_arg(out, "out")?;
        // SAFETY: writable by the contract; cleared first so a failure leaves NULL.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: NULL or live by the contract.
        let m = unsafe { handle(model, "model") }?;
        // SAFETY: `n_ids` elements by the contract.
        let ids = unsafe { slice_arg(ids, n_ids, "ids") }?;
        let text = m.model.detokenize(ids)?;
        let s = malloc_string(text.as_bytes())?;
        // SAFETY: checked above; `out_len` NULL or writable by the contract.
        unsafe {
            out.write(s);
            if !out_len.is_null() {
                out_len.write(text.len());
            }
        }
        Ok(())
    })
}

/// The prompt tokens of a conversation, ready for the assistant's answer: the messages
/// rendered with the model's own chat template (ChatML when the file has none, as
/// llama.cpp does) and tokenized. `out`, `capacity` and `*n_out` work as in
/// `mica_tokenize()`.
///
/// Thread-safe.
///
/// # Safety
/// `model` is NULL or a live handle; `messages` is NULL or holds `n_messages` messages whose
/// strings are NULL or NUL-terminated; `out` is NULL or holds `capacity` elements; `n_out`
/// is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_chat_prompt(
    model: *const MicaModel,
    messages: *const MicaChatMessage,
    n_messages: usize,
    out: *mut u32,
    capacity: usize,
    n_out: *mut usize,
) -> MicaStatus {
    guard(|| {
        out_arg(n_out, "n_out")?;
        // SAFETY: NULL or live by the contract.
        let m = unsafe { handle(model, "model") }?;
        // SAFETY: `n_messages` elements by the contract.
        let raw = unsafe { slice_arg(messages, n_messages, "messages") }?;
        let mut msgs = Vec::with_capacity(raw.len());
        for (i, msg) in raw.iter().enumerate() {
            // SAFETY: NULL or NUL-terminated by the contract.
            let role = unsafe { str_arg(msg.role, &format!("messages[{i}].role")) }?;
            // SAFETY: as above.
            let content = unsafe { str_arg(msg.content, &format!("messages[{i}].content")) }?;
            msgs.push(ChatMessage::new(role, content));
        }
        let ids = m.model.chat_prompt(&msgs)?;
        // SAFETY: `n_out` checked; `out` holds `capacity` elements by the contract.
        unsafe { write_buffer(&ids, out, capacity, n_out, "out") }
    })
}
