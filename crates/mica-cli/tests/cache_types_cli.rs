//! `--cache-type-k/-v` through the real binary: `run` and `bench` accept llama.cpp's cache
//! types and `bench --json` reports them (llama-bench's `type_k`/`type_v`), with `bench -d`
//! depths; an unknown type is one clear error listing the types.

mod common;

use common::*;

#[test]
fn cache_types_run_and_are_reported() {
    let m = model_path("smollm2-135m-instruct-q4_1");
    let m = m.to_str().unwrap();
    let (ok, out, err) = mica(&[
        "run",
        "-m",
        m,
        "-p",
        "The capital of France is",
        "-n",
        "6",
        "-t",
        "2",
        "--temp",
        "0",
        "--json",
        "--cache-type-k",
        "q8_0",
        "--cache-type-v",
        "q4_0",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["output_ids"].as_array().unwrap().len(), 6, "{out}");

    let (ok, out, err) = mica(&[
        "bench",
        "-m",
        m,
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "1",
        "-t",
        "1",
        "--json",
        "--cache-type-k",
        "q4_0",
        "-d",
        "0,8",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let recs = v.as_array().unwrap();
    for rec in recs {
        assert_eq!(rec["type_k"], "q4_0", "{rec}");
        assert_eq!(rec["type_v"], "f16", "{rec}");
    }
    // SmolLM2: 30 layers of 3 KV heads × 64; q4_0 keys (18 bytes per 32) and f16 values.
    assert_eq!(
        recs[0]["kv_bytes_per_token"],
        30 * (192 / 32 * 18 + 192 * 2)
    );
    let depths: Vec<u64> = recs
        .iter()
        .map(|r| r["n_depth"].as_u64().unwrap())
        .collect();
    assert_eq!(depths, [0, 8, 0, 8]);
}

#[test]
fn an_unknown_cache_type_is_a_clear_error() {
    let m = model_path("smollm2-135m-instruct-q4_1");
    let (ok, _, err) = mica(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "Hi",
        "-n",
        "2",
        "--cache-type-v",
        "q3_k",
    ]);
    assert!(!ok);
    assert!(
        err.contains("unknown cache type 'q3_k'") && err.contains("iq4_nl"),
        "{err}"
    );
}
