//! Importance-matrix collection and perplexity called as a library on the SmolLM2 test
//! model (scripts/fetch-test-models; `MICA_TEST_MODELS` names the folder): the calibration
//! and scoring tasks report one advance per window, the running perplexity ends at the
//! reported figure, a model against itself has no KL-divergence, and too short a text is a
//! typed error.

use mica_models::LoadedModel;
use mica_quant::imatrix::{Windows, collect};
use mica_quant::{Event, Imatrix, Perplexity, PerplexityOptions, QuantError, Task};
use std::path::PathBuf;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn smollm2() -> LoadedModel {
    let dir = std::env::var_os("MICA_TEST_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("models"));
    let p = dir.join("smollm2-135m-instruct-q4_1.gguf");
    assert!(
        p.is_file(),
        "test model {} is missing: run scripts/fetch-test-models, or set MICA_TEST_MODELS",
        p.display()
    );
    LoadedModel::open(p).unwrap()
}

fn text(name: &str) -> String {
    std::fs::read_to_string(workspace().join("fixtures/text").join(name)).unwrap()
}

/// The task started, the sum of its advances, and whether it finished last.
fn task_of(events: &[Event]) -> (Event, u64, bool) {
    let advanced = events
        .iter()
        .map(|e| if let Event::Advance(n) = e { *n } else { 0 })
        .sum();
    (
        events[0].clone(),
        advanced,
        events.last() == Some(&Event::Finish),
    )
}

#[test]
fn perplexity_reports_each_window_and_no_divergence_from_itself() {
    let lm = smollm2();
    let opts = PerplexityOptions {
        n_ctx: 64,
        max_windows: Some(3),
        threads: 2,
    };
    let eval = Perplexity::new(&lm, Some(&lm), &text("GPL-3"), opts).unwrap();
    assert_eq!(eval.n_windows(), 3);
    assert!(!eval.base_tokenizes_differently());
    let mut events = Vec::new();
    let report = eval.run(&mut |e| events.push(e)).unwrap();
    let (start, advanced, finished) = task_of(&events);
    assert_eq!(
        start,
        Event::Start {
            task: Task::Perplexity,
            total: 3
        }
    );
    assert!(advanced == 3 && finished, "{events:?}");
    let running: Vec<f64> = events
        .iter()
        .filter_map(|e| {
            if let Event::Perplexity(p) = e {
                Some(*p)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(running.len(), 3);
    // Each window scores positions 32..62 (31 next tokens).
    assert_eq!((report.windows, report.nll.count), (3, 3 * 31));
    let (ppl, _) = report.nll.estimate();
    assert_eq!(running[2], ppl);
    assert!(ppl > 1.0 && ppl < 1000.0, "{ppl}");
    let kl = report.kl.unwrap();
    assert_eq!((kl.mean, kl.max, kl.same_top), (0.0, 0.0, 1.0));
    assert_eq!(kl.base_ppl.0, ppl);

    // Two windows are the least; the error says how many tokens there are.
    let e = Perplexity::new(&lm, None, "a few words", opts)
        .err()
        .unwrap();
    match e {
        QuantError::TextTooShort { tokens, needed, .. } => assert!(tokens < 10 && needed == 128),
        e => panic!("{e}"),
    }
}

#[test]
fn collection_reports_each_window_and_round_trips() {
    let lm = smollm2();
    let mut events = Vec::new();
    let windows = Windows {
        n_ctx: 32,
        max: Some(2),
    };
    let m = collect(
        &lm,
        &text("calibration.txt"),
        "calib",
        windows,
        2,
        &mut |e| events.push(e),
    )
    .unwrap();
    let (start, advanced, finished) = task_of(&events);
    assert_eq!(
        start,
        Event::Start {
            task: Task::Calibrate,
            total: 2
        }
    );
    assert!(advanced == 2 && finished, "{events:?}");
    // Every projection of 30 layers (7 each) and the output; 64 tokens counted.
    assert_eq!(m.entries.len(), 211);
    assert_eq!(m.entries["blk.0.attn_q.weight"].1, 64.0);
    assert_eq!((m.chunk_count, m.chunk_size), (2, 32));

    let p = std::env::temp_dir().join(format!("mica-quant-eval-{}.gguf", std::process::id()));
    m.write(&p).unwrap();
    let r = Imatrix::read(&p).unwrap();
    std::fs::remove_file(&p).ok();
    assert_eq!(r.entries, m.entries);
    assert_eq!(r.datasets, vec!["calib".to_string()]);
}
