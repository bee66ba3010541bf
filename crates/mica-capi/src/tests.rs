//! The C functions called as C would call them, on the SmolLM2 test model, against the
//! `mica` facade: the same tokens, text and logits (bit for bit); status codes and messages
//! for NULLs, invalid UTF-8, bad values, small buffers and missing models; the engine from
//! several threads at once; store names; a session refusing work after a panic.

use crate::engine::*;
use crate::error::{MicaStatus, guard};
use crate::model::*;
use crate::params::*;
use crate::session::*;
use crate::{mica_last_error, mica_string_free};
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::PathBuf;
use std::ptr::{null, null_mut};
use std::sync::OnceLock;

fn model_path() -> PathBuf {
    let dir = std::env::var_os("MICA_TEST_MODELS")
        .expect("MICA_TEST_MODELS is not set: run scripts/test, which fetches the test models");
    let p = PathBuf::from(dir).join("smollm2-135m-instruct-q4_1.gguf");
    assert!(p.is_file(), "{} is missing", p.display());
    p
}

fn cstr(s: &str) -> CString {
    CString::new(s).unwrap()
}

fn last_error() -> String {
    unsafe { CStr::from_ptr(mica_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A model handle shared by the tests (models are thread-safe).
struct Shared(*mut MicaModel);
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

fn model() -> *const MicaModel {
    static MODEL: OnceLock<Shared> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let path = cstr(model_path().to_str().unwrap());
            let mut m = null_mut();
            let s = unsafe { mica_model_open(path.as_ptr(), null(), &mut m) };
            assert_eq!(s, MicaStatus::Ok, "{}", last_error());
            Shared(m)
        })
        .0
}

fn facade_model() -> &'static facade::Model {
    static MODEL: OnceLock<facade::Model> = OnceLock::new();
    MODEL.get_or_init(|| facade::Model::open(model_path()).unwrap())
}

fn session() -> *mut MicaSession {
    let opts = MicaSessionOptions {
        n_ctx: 512,
        n_threads: 2,
    };
    let mut s = null_mut();
    assert_eq!(
        unsafe { mica_session_new(model(), &opts, &mut s) },
        MicaStatus::Ok
    );
    s
}

fn greedy(max_tokens: usize) -> MicaGenerateParams {
    MicaGenerateParams {
        max_tokens,
        temperature: 0.0,
        ..mica_generate_params_default()
    }
}

fn facade_greedy(max_tokens: usize) -> facade::GenerateParams {
    facade::GenerateParams {
        max_tokens,
        sampling: facade::SamplingParams::greedy(),
        ..Default::default()
    }
}

fn tokenize(text: &str) -> Vec<u32> {
    let t = cstr(text);
    let mut n = 0;
    let s = unsafe { mica_tokenize(model(), t.as_ptr(), true, true, null_mut(), 0, &mut n) };
    assert_eq!(s, MicaStatus::BufferTooSmall, "a size query");
    let mut ids = vec![0u32; n];
    let s = unsafe { mica_tokenize(model(), t.as_ptr(), true, true, ids.as_mut_ptr(), n, &mut n) };
    assert_eq!(s, MicaStatus::Ok, "{}", last_error());
    assert_eq!(n, ids.len());
    ids
}

/// The text a [`MicaOnText`] received, and after how many pieces it stops (0: never).
struct Collected {
    text: String,
    pieces: usize,
    stop_after: usize,
}

unsafe extern "C" fn collect(text: *const c_char, len: usize, user: *mut c_void) -> c_int {
    let c = unsafe { &mut *user.cast::<Collected>() };
    let bytes = unsafe { std::slice::from_raw_parts(text.cast::<u8>(), len + 1) };
    assert_eq!(bytes[len], 0, "the piece is NUL-terminated");
    c.text.push_str(std::str::from_utf8(&bytes[..len]).unwrap());
    c.pieces += 1;
    (c.stop_after > 0 && c.pieces >= c.stop_after) as c_int
}

fn completion_text(c: &MicaCompletion) -> String {
    let bytes = unsafe { std::slice::from_raw_parts(c.text.cast::<u8>(), c.text_len) };
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn completion_tokens(c: &MicaCompletion) -> Vec<u32> {
    if c.n_tokens == 0 {
        return Vec::new();
    }
    unsafe { std::slice::from_raw_parts(c.tokens, c.n_tokens) }.to_vec()
}

#[test]
fn opening_reports_nulls_bad_utf8_missing_and_unreadable_files() {
    let mut m = null_mut();
    assert_eq!(
        unsafe { mica_model_open(null(), null(), &mut m) },
        MicaStatus::NullArgument
    );
    assert_eq!(last_error(), "path_or_name is NULL");
    let p = cstr(model_path().to_str().unwrap());
    assert_eq!(
        unsafe { mica_model_open(p.as_ptr(), null(), null_mut()) },
        MicaStatus::NullArgument
    );
    let bad = b"model\xff.gguf\0";
    assert_eq!(
        unsafe { mica_model_open(bad.as_ptr().cast(), null(), &mut m) },
        MicaStatus::InvalidUtf8
    );
    let missing = cstr("/nonexistent/model.gguf");
    assert_eq!(
        unsafe { mica_model_open(missing.as_ptr(), null(), &mut m) },
        MicaStatus::NotFound
    );
    assert!(m.is_null());
    assert!(
        last_error().contains("/nonexistent/model.gguf"),
        "{}",
        last_error()
    );
    let not_a_model = cstr(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"));
    assert_eq!(
        unsafe { mica_model_open(not_a_model.as_ptr(), null(), &mut m) },
        MicaStatus::ModelLoad,
        "{}",
        last_error()
    );
    assert!(last_error().contains("Cargo.toml"), "{}", last_error());
    assert_eq!(unsafe { mica_model_n_vocab(null()) }, 0);
    unsafe { mica_model_free(null_mut()) };
}

#[test]
fn tokens_and_chat_prompts_match_the_facade() {
    let fm = facade_model();
    assert_eq!(unsafe { mica_model_n_vocab(model()) }, fm.n_vocab());
    assert_eq!(unsafe { mica_model_n_ctx_train(model()) }, fm.n_ctx_train());
    let text = "The capital of France is <|im_start|> Paris";
    let ids = tokenize(text);
    assert_eq!(ids, fm.tokenize(text).unwrap());

    let mut out = null_mut();
    let mut len = 0;
    let s = unsafe { mica_detokenize(model(), ids.as_ptr(), ids.len(), &mut out, &mut len) };
    assert_eq!(s, MicaStatus::Ok);
    let back = unsafe { CStr::from_ptr(out) }.to_str().unwrap().to_string();
    assert_eq!((back.as_str(), len), (text, text.len()));
    unsafe { mica_string_free(out) };

    let bad_id = [fm.n_vocab() as u32];
    let s = unsafe { mica_detokenize(model(), bad_id.as_ptr(), 1, &mut out, null_mut()) };
    assert_eq!(s, MicaStatus::InvalidArgument);
    assert!(out.is_null());

    let (sys, user) = (cstr("system"), cstr("Be brief."));
    let (role, content) = (cstr("user"), cstr("What is Rust?"));
    let msgs = [
        MicaChatMessage {
            role: sys.as_ptr(),
            content: user.as_ptr(),
        },
        MicaChatMessage {
            role: role.as_ptr(),
            content: content.as_ptr(),
        },
    ];
    let want = fm
        .chat_prompt(&[
            facade::ChatMessage::new("system", "Be brief."),
            facade::ChatMessage::new("user", "What is Rust?"),
        ])
        .unwrap();
    let mut got = vec![0u32; want.len() - 1];
    let mut n = 0;
    let s = unsafe {
        mica_chat_prompt(
            model(),
            msgs.as_ptr(),
            2,
            got.as_mut_ptr(),
            got.len(),
            &mut n,
        )
    };
    assert_eq!((s, n), (MicaStatus::BufferTooSmall, want.len()));
    assert!(
        got.iter().all(|&t| t == 0),
        "nothing written to a small buffer"
    );
    got.resize(n, 0);
    let s = unsafe { mica_chat_prompt(model(), msgs.as_ptr(), 2, got.as_mut_ptr(), n, &mut n) };
    assert_eq!(s, MicaStatus::Ok);
    assert_eq!(got, want);

    let no_role = [MicaChatMessage {
        role: null(),
        content: content.as_ptr(),
    }];
    let s = unsafe { mica_chat_prompt(model(), no_role.as_ptr(), 1, null_mut(), 0, &mut n) };
    assert_eq!(s, MicaStatus::NullArgument);
    assert_eq!(last_error(), "messages[0].role is NULL");
}

#[test]
fn a_session_streams_the_facades_greedy_tokens_and_its_logits() {
    let fm = facade_model();
    let prompt = tokenize("The capital of France is");
    let mut fs = fm.session(facade::SessionOptions {
        n_ctx: Some(512),
        threads: Some(2),
    });
    let want = fs.generate(&prompt, &facade_greedy(16)).unwrap();

    let s = session();
    let mut got = Collected {
        text: String::new(),
        pieces: 0,
        stop_after: 0,
    };
    let mut c = empty_completion();
    let user = (&mut got as *mut Collected).cast();
    let st = unsafe {
        mica_session_generate(
            s,
            prompt.as_ptr(),
            prompt.len(),
            &greedy(16),
            Some(collect),
            user,
            &mut c,
        )
    };
    assert_eq!(st, MicaStatus::Ok, "{}", last_error());
    assert_eq!(completion_tokens(&c), want.output_ids);
    assert_eq!(completion_text(&c), want.text);
    assert_eq!(got.text, want.text, "the streamed pieces make up the text");
    assert_eq!(c.finish, want.finish.into());
    assert_eq!((c.prompt_tokens, c.cached_tokens), (prompt.len(), 0));
    unsafe { mica_completion_free(&mut c) };
    assert!(c.text.is_null() && c.tokens.is_null() && c.n_tokens == 0);
    unsafe { mica_completion_free(&mut c) };

    // The next turn extends the previous prompt and answer: only the new tokens run.
    let mut longer = prompt.clone();
    longer.extend(&want.output_ids);
    longer.extend(tokenize(" And Germany?"));
    let st = unsafe {
        mica_session_generate(
            s,
            longer.as_ptr(),
            longer.len(),
            &greedy(4),
            None,
            null_mut(),
            &mut c,
        )
    };
    assert_eq!(st, MicaStatus::Ok);
    assert!(
        c.cached_tokens >= prompt.len(),
        "{} cached",
        c.cached_tokens
    );
    unsafe { mica_completion_free(&mut c) };

    // Logits: a size query, then the same floats as the facade, bit for bit.
    let n_vocab = fm.n_vocab();
    let mut n = 0;
    let st = unsafe {
        mica_session_logits(
            s,
            prompt.as_ptr(),
            prompt.len(),
            false,
            null_mut(),
            0,
            &mut n,
        )
    };
    assert_eq!((st, n), (MicaStatus::BufferTooSmall, n_vocab));
    let mut logits = vec![0f32; n];
    let st = unsafe {
        mica_session_logits(
            s,
            prompt.as_ptr(),
            prompt.len(),
            false,
            logits.as_mut_ptr(),
            n,
            &mut n,
        )
    };
    assert_eq!(st, MicaStatus::Ok);
    let want_logits = fs.logits(&prompt).unwrap();
    assert!(
        logits
            .iter()
            .zip(&want_logits)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
    let mut all = vec![0f32; prompt.len() * n_vocab];
    let st = unsafe {
        mica_session_logits(
            s,
            prompt.as_ptr(),
            prompt.len(),
            true,
            all.as_mut_ptr(),
            all.len(),
            &mut n,
        )
    };
    assert_eq!((st, n), (MicaStatus::Ok, prompt.len() * n_vocab));
    let want_all = fs.logits_all(&prompt).unwrap();
    assert!(
        all.iter()
            .zip(&want_all)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
    unsafe { mica_session_free(s) };
}

#[test]
fn a_session_stops_on_the_callback_stop_strings_and_rejects_bad_values() {
    let prompt = tokenize("The capital of France is");
    let s = session();
    let mut got = Collected {
        text: String::new(),
        pieces: 0,
        stop_after: 2,
    };
    let mut c = empty_completion();
    let user = (&mut got as *mut Collected).cast();
    let st = unsafe {
        mica_session_generate(
            s,
            prompt.as_ptr(),
            prompt.len(),
            &greedy(32),
            Some(collect),
            user,
            &mut c,
        )
    };
    assert_eq!(st, MicaStatus::Ok);
    assert_eq!(c.finish, MicaFinishReason::Cancelled);
    assert_eq!(got.pieces, 2);
    assert!(c.n_tokens < 32);
    unsafe { mica_completion_free(&mut c) };

    // A stop string: the text ends before it.
    let full = facade_model()
        .session(facade::SessionOptions {
            n_ctx: Some(512),
            threads: Some(2),
        })
        .generate(&prompt, &facade_greedy(16))
        .unwrap()
        .text;
    let stop = cstr("United");
    assert!(full.contains("United"), "{full:?}");
    let stops = [stop.as_ptr()];
    let params = MicaGenerateParams {
        stop: stops.as_ptr(),
        n_stop: 1,
        ..greedy(16)
    };
    let st = unsafe {
        mica_session_generate(
            s,
            prompt.as_ptr(),
            prompt.len(),
            &params,
            None,
            null_mut(),
            &mut c,
        )
    };
    assert_eq!(st, MicaStatus::Ok);
    assert_eq!(c.finish, MicaFinishReason::Stop);
    assert_eq!(completion_text(&c), full[..full.find("United").unwrap()]);
    unsafe { mica_completion_free(&mut c) };

    let params = MicaGenerateParams {
        top_p: 2.0,
        temperature: 0.8,
        ..greedy(4)
    };
    let st = unsafe {
        mica_session_generate(
            s,
            prompt.as_ptr(),
            prompt.len(),
            &params,
            None,
            null_mut(),
            &mut c,
        )
    };
    assert_eq!(st, MicaStatus::InvalidArgument);
    assert!(last_error().contains("top-p"), "{}", last_error());
    assert!(c.text.is_null(), "a failed call leaves an empty completion");
    let bad = [u32::MAX];
    let st =
        unsafe { mica_session_generate(s, bad.as_ptr(), 1, null(), None, null_mut(), null_mut()) };
    assert_eq!(st, MicaStatus::InvalidArgument, "{}", last_error());
    let st = unsafe { mica_session_generate(s, null(), 3, null(), None, null_mut(), null_mut()) };
    assert_eq!(st, MicaStatus::NullArgument);
    let st = unsafe {
        mica_session_generate(
            null_mut(),
            prompt.as_ptr(),
            prompt.len(),
            null(),
            None,
            null_mut(),
            null_mut(),
        )
    };
    assert_eq!(st, MicaStatus::NullArgument);
    assert_eq!(last_error(), "session is NULL");
    unsafe { mica_session_free(s) };
}

#[test]
fn a_session_refuses_work_after_a_panic_inside_it() {
    let s = session();
    let st = guard(|| {
        let sess = unsafe { &mut *s };
        sess.run(|_| -> crate::error::Result<()> { panic!("simulated bug") })
    });
    assert_eq!(st, MicaStatus::Internal);
    assert!(last_error().contains("simulated bug"), "{}", last_error());
    let prompt = tokenize("Hello");
    let st = unsafe {
        mica_session_generate(
            s,
            prompt.as_ptr(),
            prompt.len(),
            null(),
            None,
            null_mut(),
            null_mut(),
        )
    };
    assert_eq!(st, MicaStatus::Internal);
    assert!(last_error().contains("free it"), "{}", last_error());
    unsafe { mica_session_free(s) };
}

/// A raw engine pointer crossing into worker threads (engines are thread-safe).
#[derive(Clone, Copy)]
struct EnginePtr(*const MicaEngine);
unsafe impl Send for EnginePtr {}

#[test]
fn an_engine_serves_threads_at_once_with_the_sessions_tokens() {
    let prompt = tokenize("The capital of France is");
    let want = facade_model()
        .session(facade::SessionOptions {
            n_ctx: Some(512),
            threads: Some(2),
        })
        .generate(&prompt, &facade_greedy(12))
        .unwrap();
    let opts = MicaEngineOptions {
        n_ctx: 512,
        n_threads: 2,
        kv_bytes: 32 << 20,
        ..mica_engine_options_default()
    };
    let mut e = null_mut();
    assert_eq!(
        unsafe { mica_engine_start(model(), &opts, &mut e) },
        MicaStatus::Ok
    );
    assert!(unsafe { mica_engine_n_ctx(e) } > 0);
    let ptr = EnginePtr(e);
    let threads: Vec<_> = (0..3)
        .map(|i| {
            let prompt = prompt.clone();
            std::thread::spawn(move || {
                let ptr = ptr;
                // The second thread stops after one piece.
                let mut got = Collected {
                    text: String::new(),
                    pieces: 0,
                    stop_after: usize::from(i == 1),
                };
                let mut c = empty_completion();
                let user = (&mut got as *mut Collected).cast();
                let st = unsafe {
                    mica_engine_generate(
                        ptr.0,
                        prompt.as_ptr(),
                        prompt.len(),
                        &greedy(12),
                        Some(collect),
                        user,
                        &mut c,
                    )
                };
                assert_eq!(st, MicaStatus::Ok, "{}", last_error());
                let out = (
                    completion_tokens(&c),
                    completion_text(&c),
                    c.finish,
                    got.text,
                );
                unsafe { mica_completion_free(&mut c) };
                out
            })
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        let (tokens, text, finish, streamed) = t.join().unwrap();
        if i == 1 {
            assert_eq!(finish, MicaFinishReason::Cancelled);
            assert!(tokens.len() < want.output_ids.len());
            assert_eq!(tokens, want.output_ids[..tokens.len()]);
            assert!(want.text.starts_with(&streamed), "{streamed:?}");
        } else {
            assert_eq!(tokens, want.output_ids);
            assert_eq!((&text, &streamed), (&want.text, &want.text));
            assert_eq!(finish, want.finish.into());
        }
    }
    let mut m = null_mut();
    assert_eq!(unsafe { mica_engine_metrics(e, &mut m) }, MicaStatus::Ok);
    let metrics = unsafe { CStr::from_ptr(m) }.to_str().unwrap().to_string();
    unsafe { mica_string_free(m) };
    assert!(metrics.contains("mica_requests_total"), "{metrics}");
    assert!(
        metrics.contains("smollm2-135m-instruct-q4_1.gguf"),
        "{metrics}"
    );
    let st = unsafe { mica_engine_generate(e, null(), 0, null(), None, null_mut(), null_mut()) };
    assert_eq!(st, MicaStatus::InvalidArgument);
    assert_eq!(last_error(), "the prompt is empty");
    unsafe { mica_engine_free(e) };
    assert_eq!(
        unsafe {
            mica_engine_generate(
                null(),
                prompt.as_ptr(),
                1,
                null(),
                None,
                null_mut(),
                null_mut(),
            )
        },
        MicaStatus::NullArgument
    );
}

#[cfg(unix)]
#[test]
fn names_resolve_in_a_store_without_pulling() {
    let store = std::env::temp_dir().join(format!("mica-capi-store-{}", std::process::id()));
    std::fs::create_dir_all(&store).unwrap();
    let link = store.join("smollm2-135m-instruct-q4_1.gguf");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(model_path(), &link).unwrap();
    let dir = cstr(store.to_str().unwrap());
    let opts = MicaModelOptions {
        store_dir: dir.as_ptr(),
        repack: false,
        ..mica_model_options_default()
    };
    let mut m = null_mut();
    let name = cstr("smollm2-135m-instruct");
    let st = unsafe { mica_model_open(name.as_ptr(), &opts, &mut m) };
    assert_eq!(st, MicaStatus::Ok, "{}", last_error());
    assert_eq!(unsafe { mica_model_n_vocab(m) }, facade_model().n_vocab());
    unsafe { mica_model_free(m) };

    let other = cstr("gemma3-270m");
    let st = unsafe { mica_model_open(other.as_ptr(), &opts, &mut m) };
    assert_eq!(st, MicaStatus::NotFound);
    assert!(last_error().contains("pulling is off"), "{}", last_error());
    // Without a store, a name is only a path that does not exist.
    let st = unsafe { mica_model_open(name.as_ptr(), null(), &mut m) };
    assert_eq!(st, MicaStatus::NotFound);
    std::fs::remove_dir_all(&store).unwrap();
}

#[test]
fn typical_xtc_and_dry_reach_the_sampler() {
    let loop_prompt =
        tokenize("I like apples. I like apples. I like apples. I like apples. I like");
    let dot = cstr(".");
    let breakers = [dot.as_ptr()];
    let params = MicaGenerateParams {
        typical_p: 0.9,
        xtc_probability: 0.25,
        xtc_threshold: 0.2,
        dry_multiplier: 0.8,
        dry_base: 1.5,
        dry_allowed_length: 3,
        dry_penalty_last_n: 48,
        dry_sequence_breakers: breakers.as_ptr(),
        n_dry_sequence_breakers: 1,
        ..greedy(12)
    };
    let f = unsafe { params.to_facade() }.unwrap().sampling;
    assert_eq!(
        (f.typical_p, f.xtc_probability, f.xtc_threshold),
        (0.9, 0.25, 0.2)
    );
    assert_eq!((f.dry_multiplier, f.dry_base), (0.8, 1.5));
    assert_eq!((f.dry_allowed_length, f.dry_penalty_last_n), (3, 48));
    assert_eq!(f.dry_sequence_breakers, ["."]);
    let d = unsafe { mica_generate_params_default().to_facade() }.unwrap();
    assert_eq!(
        d.sampling,
        facade::SamplingParams::default(),
        "NULL breakers: the defaults"
    );
    let bad = [c"\xff".as_ptr()];
    let e = unsafe {
        MicaGenerateParams {
            dry_sequence_breakers: bad.as_ptr(),
            n_dry_sequence_breakers: 1,
            ..greedy(1)
        }
        .to_facade()
    }
    .unwrap_err();
    assert!(
        e.message.contains("dry_sequence_breakers[0]"),
        "{}",
        e.message
    );

    // DRY ends SmolLM2's greedy repetition, through the C API as through the facade.
    let dry = MicaGenerateParams {
        dry_multiplier: 0.8,
        ..greedy(12)
    };
    let s = session();
    let run = |p: &MicaGenerateParams| {
        let mut c = empty_completion();
        let st = unsafe {
            mica_session_generate(
                s,
                loop_prompt.as_ptr(),
                loop_prompt.len(),
                p,
                None,
                null_mut(),
                &mut c,
            )
        };
        assert_eq!(st, MicaStatus::Ok, "{}", last_error());
        let t = completion_text(&c);
        unsafe { mica_completion_free(&mut c) };
        t
    };
    let plain = run(&greedy(12));
    let with_dry = run(&dry);
    assert!(plain.matches("apples").count() >= 2, "{plain:?}");
    assert!(!with_dry.contains("I like apples"), "{with_dry:?}");
    let want = facade_model()
        .session(facade::SessionOptions {
            n_ctx: Some(512),
            threads: Some(2),
        })
        .generate(&loop_prompt, &unsafe { dry.to_facade() }.unwrap())
        .unwrap()
        .text;
    assert_eq!(with_dry, want);
    let st = unsafe {
        mica_session_generate(
            s,
            loop_prompt.as_ptr(),
            loop_prompt.len(),
            &MicaGenerateParams {
                dry_base: 0.5,
                dry_multiplier: 0.8,
                ..greedy(2)
            },
            None,
            null_mut(),
            &mut empty_completion(),
        )
    };
    assert_eq!(st, MicaStatus::InvalidArgument);
    assert!(last_error().contains("DRY base"), "{}", last_error());
    unsafe { mica_session_free(s) };
}
