//! `--trace FILE` through the real binary: the file is a Chrome trace-event JSON array with
//! the forward pass's spans (one `forward` per pass, a `layer` per layer, `attention`,
//! `feed_forward`, and `matmul` with its shape and type as arguments).

mod common;

use common::*;

#[test]
fn run_writes_a_chrome_trace() {
    let m = model_path("smollm2-135m-instruct-q4_1");
    let out = scratch("trace").join("run.json");
    let (ok, _, err) = mica(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "Hello",
        "-n",
        "3",
        "--temp",
        "0",
        "-t",
        "2",
        "--trace",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let events: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let begins = |name: &str| {
        events
            .iter()
            .filter(|e| e["ph"] == "B" && e["name"] == name)
            .count()
    };
    // Three tokens: the prompt's pass and two decode steps, 30 layers each.
    assert_eq!(begins("forward"), 3);
    assert_eq!(begins("layer"), 90);
    assert_eq!(begins("attention"), 90);
    assert_eq!(begins("feed_forward"), 90);
    let mm = events
        .iter()
        .find(|e| e["name"] == "matmul")
        .expect("matmul spans");
    assert_eq!(mm["args"]["dtype"], "\"Q4_1\"");
    assert!(mm["args"]["rows"].as_str().is_some(), "{mm}");
}
