//! The facade against the layers beneath it, on the SmolLM2 test model: the same tokens and
//! logits as the engine crate's own session, streams that cancel when dropped, typed errors,
//! store names, conversion.

use mica::{
    ChatMessage, EngineOptions, Error, Event, FinishReason, GenerateParams, Model, ModelOptions,
    Request, SamplingParams, SessionOptions, SubmitError,
};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn model_path() -> PathBuf {
    let dir = std::env::var_os("MICA_TEST_MODELS")
        .expect("MICA_TEST_MODELS is not set: run scripts/test, which fetches the test models");
    let p = PathBuf::from(dir).join("smollm2-135m-instruct-q4_1.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-test-models",
        p.display()
    );
    p
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: SamplingParams::greedy(),
        ..Default::default()
    }
}

fn opts() -> SessionOptions {
    SessionOptions {
        n_ctx: Some(512),
        threads: Some(2),
    }
}

#[test]
fn session_and_engine_match_the_engine_crate() {
    let model = Model::open(model_path()).unwrap();
    let prompt = model
        .chat_prompt(&[ChatMessage::new("user", "Name three colours.")])
        .unwrap();
    // The layer beneath, driven directly.
    let mut raw = mica::engine::Session::new(&**model.loaded(), 512, 2);
    let want = raw.generate(&prompt, &greedy(24), |_| true).unwrap();
    let want_logits = {
        raw.reset();
        raw.eval(&prompt, true).unwrap()
    };

    let mut s = model.session(opts());
    let mut streamed = String::new();
    let got = s
        .stream(&prompt, &greedy(24), |t| {
            streamed.push_str(t);
            true
        })
        .unwrap();
    assert_eq!(got.output_ids, want.output_ids);
    assert_eq!(got.text, want.text);
    assert_eq!(streamed, want.text);
    assert_eq!(s.logits_all(&prompt).unwrap(), want_logits, "bit for bit");
    let n_vocab = model.n_vocab();
    let last = &want_logits[want_logits.len() - n_vocab..];
    assert_eq!(s.logits(&prompt).unwrap(), last);

    let engine = model
        .engine(EngineOptions {
            threads: Some(2),
            ..Default::default()
        })
        .unwrap();
    let c = engine.generate(&prompt, &greedy(24)).unwrap();
    assert_eq!(c.tokens, want.output_ids);
    assert_eq!(c.text, want.text);
    assert_eq!(c.usage.prompt_tokens, prompt.len());
    assert_eq!(c.finish, Some(want.finish));
}

#[test]
fn tokenize_detokenize_round_trip() {
    let model = Model::open(model_path()).unwrap();
    let ids = model.tokenize_with("Hello, world!", false, false).unwrap();
    assert!(!ids.is_empty());
    assert_eq!(model.detokenize(&ids).unwrap(), "Hello, world!");
    // Special tokens written in the text are parsed by default.
    let special = model.tokenize("<|im_start|>").unwrap();
    let spelled = model.tokenize_with("<|im_start|>", true, false).unwrap();
    assert!(special.len() < spelled.len());
}

#[test]
fn dropping_a_stream_cancels_the_request() {
    let model = Model::open(model_path()).unwrap();
    let engine = model
        .engine(EngineOptions {
            threads: Some(2),
            ..Default::default()
        })
        .unwrap();
    let prompt = model.tokenize("Once upon a time").unwrap();
    let mut params = greedy(400);
    params.ignore_eos = true;
    let mut stream = engine.submit(Request::new(prompt, params)).unwrap();
    let first = stream.next().expect("a first event");
    assert!(matches!(first, Event::Token { .. }), "{first:?}");
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(10);
    let m = engine.metrics();
    loop {
        let running = m.running.load(std::sync::atomic::Ordering::Relaxed);
        let used = m.kv_blocks_used.load(std::sync::atomic::Ordering::Relaxed);
        if running == 0 && used == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {running} running, {used} blocks used"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Far fewer than the 400 tokens asked for were generated.
    let generated = m
        .generated_tokens
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(generated < 400, "{generated} tokens generated");
}

#[test]
fn errors_are_typed() {
    let err = Model::open("/nonexistent/model.gguf").unwrap_err();
    assert!(matches!(err, Error::Model(_)), "{err:?}");

    let model = Model::open(model_path()).unwrap();
    let mut s = model.session(SessionOptions {
        n_ctx: Some(16),
        threads: Some(1),
    });
    let mut bad = greedy(4);
    bad.sampling.top_p = 2.0;
    let err = s.generate(&[1, 2, 3], &bad).unwrap_err();
    assert!(matches!(err, Error::Engine(_)), "{err:?}");
    assert!(err.to_string().contains("top"), "{err}");
    let long: Vec<u32> = vec![1; 40];
    let err = s.generate(&long, &greedy(4)).unwrap_err();
    assert!(err.to_string().contains("40 tokens"), "{err}");

    let engine = model
        .engine(EngineOptions {
            n_ctx: Some(64),
            threads: Some(1),
            ..Default::default()
        })
        .unwrap();
    let err = engine
        .submit(Request::new(vec![1; 100], greedy(4)))
        .err()
        .unwrap();
    assert!(
        matches!(err, Error::Submit(SubmitError::PromptTooLong { .. })),
        "{err:?}"
    );
    let err = engine.submit(Request::new(vec![1, 2], bad)).err().unwrap();
    match err {
        Error::Submit(SubmitError::Params(p)) => assert_eq!(p.param().as_str(), "top_p"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn store_names_and_conversion() {
    let dir = std::env::temp_dir().join(format!("mica-facade-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A converted copy in a store, opened by its name.
    let dst = dir.join("tiny-copy.gguf");
    let report = mica::convert(
        &model_path(),
        &dst,
        &mica::ConvertOptions::default(),
        &mut |_| {},
    )
    .unwrap();
    assert!(report.tensors > 0);
    let store = mica::Store::open(&dir);
    let hub = mica::Hub::default();
    let named =
        Model::from_store(&store, &hub, "tiny-copy", None, ModelOptions::default()).unwrap();
    assert_eq!(named.path(), dst.as_path());
    let original = Model::open(model_path()).unwrap();
    let prompt = original.tokenize("The capital of France is").unwrap();
    let a = original
        .session(opts())
        .generate(&prompt, &greedy(8))
        .unwrap();
    let b = named.session(opts()).generate(&prompt, &greedy(8)).unwrap();
    assert_eq!(a.output_ids, b.output_ids);
    assert_eq!(b.finish, FinishReason::Length);
    let err = Model::from_store(
        &store,
        &hub,
        "no-such-model-here",
        None,
        ModelOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::Hub(_)), "{err:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
