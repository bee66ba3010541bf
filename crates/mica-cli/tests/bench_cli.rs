//! `mica bench` through the real binary, on the tiny random-weight model: llama-bench's JSON
//! records and markdown table, and clear errors for bad flags.

mod common;

use common::*;
use serde_json::Value;

fn tiny() -> String {
    let p = scratch("bench").join("tiny.gguf");
    if !p.is_file() {
        write_tiny(&p, &Tiny::default());
    }
    p.to_str().unwrap().to_string()
}

#[test]
fn json_records_match_llama_bench_fields() {
    let m = tiny();
    let (ok, out, err) = mica(&[
        "bench", "-m", &m, "-p", "8", "-n", "4", "-r", "2", "-t", "1", "--json",
    ]);
    assert!(ok, "{err}");
    let recs: Vec<Value> = serde_json::from_str(&out).expect("stdout is one JSON array");
    assert_eq!(recs.len(), 2, "one record per test: {out}");

    let strings = [
        "build_commit",
        "cpu_info",
        "model_filename",
        "model_type",
        "type_k",
        "type_v",
        "test_time",
        "isa",
    ];
    let ints = [
        "build_number",
        "model_size",
        "model_n_params",
        "n_batch",
        "n_ubatch",
        "n_threads",
        "n_gpu_layers",
        "flash_attn",
        "n_prompt",
        "n_gen",
        "avg_ns",
        "stddev_ns",
    ];
    for r in &recs {
        for f in strings {
            assert!(r[f].is_string(), "{f} is a string in {r}");
        }
        for f in ints {
            assert!(r[f].is_u64() || r[f].is_i64(), "{f} is an integer in {r}");
        }
        for f in ["avg_ts", "stddev_ts"] {
            assert!(r[f].is_f64(), "{f} is a number in {r}");
        }
        assert_eq!(r["model_filename"], m.as_str());
        assert_eq!(r["n_threads"], 1);
        // The tiny model is float32, so it runs with an f32 KV cache.
        assert_eq!(r["type_k"], "f32");
        assert!(r["model_size"].as_u64().unwrap() > 0);
        assert!(r["model_n_params"].as_u64().unwrap() > 0);
        assert!(r["model_type"].as_str().unwrap().starts_with("llama "));
        assert!(r["avg_ns"].as_u64().unwrap() > 0);
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0);
        assert!(r["stddev_ts"].as_f64().unwrap() >= 0.0);
        let ns = r["samples_ns"].as_array().unwrap();
        let ts = r["samples_ts"].as_array().unwrap();
        assert_eq!((ns.len(), ts.len()), (2, 2), "-r 2 gives two samples");
        assert!(ns.iter().all(|v| v.as_u64().unwrap() > 0));
        assert!(ts.iter().all(|v| v.as_f64().unwrap() > 0.0));
        // tokens/s is n_tokens / time of each sample, as llama-bench.
        let n_tok = r["n_prompt"].as_f64().unwrap() + r["n_gen"].as_f64().unwrap();
        let (t0, s0) = (ns[0].as_f64().unwrap(), ts[0].as_f64().unwrap());
        assert!((1e9 * n_tok / t0 - s0).abs() < 1e-6 * s0);
        if cfg!(target_os = "linux") {
            assert!(r["peak_rss_bytes"].as_u64().unwrap() > 0);
        }
        let stamp = r["test_time"].as_str().unwrap();
        assert!(
            stamp.len() == 20 && stamp.ends_with('Z'),
            "RFC 3339: {stamp}"
        );
    }
    assert_eq!(
        (recs[0]["n_prompt"].clone(), recs[0]["n_gen"].clone()),
        (8.into(), 0.into())
    );
    assert_eq!(
        (recs[1]["n_prompt"].clone(), recs[1]["n_gen"].clone()),
        (0.into(), 4.into())
    );
}

#[test]
fn table_like_llama_bench() {
    let m = tiny();
    let (ok, out, err) = mica(&[
        "bench", "-m", &m, "-p", "8,16", "-n", "4", "-r", "1", "-t", "1,2",
    ]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    let head: Vec<&str> = lines[0].split('|').map(str::trim).collect();
    assert_eq!(
        head,
        [
            "", "model", "size", "params", "backend", "threads", "test", "t/s", ""
        ]
    );
    assert!(lines[1].starts_with("| ---") && lines[1].contains("---: |"));
    let rows: Vec<Vec<&str>> = lines[2..]
        .iter()
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.split('|').map(str::trim).collect())
        .collect();
    let tests: Vec<(&str, &str)> = rows.iter().map(|r| (r[5], r[6])).collect();
    assert_eq!(
        tests,
        [
            ("1", "pp8"),
            ("1", "pp16"),
            ("1", "tg4"),
            ("2", "pp8"),
            ("2", "pp16"),
            ("2", "tg4")
        ]
    );
    for r in &rows {
        assert!(r[1].starts_with("llama "), "{r:?}");
        assert!(r[2].ends_with(" MiB") && r[3].ends_with(" M"), "{r:?}");
        let (mean, std) = r[7].split_once(" ± ").expect("mean ± std");
        assert!(mean.parse::<f64>().unwrap() > 0.0, "{r:?}");
        assert!(std.parse::<f64>().unwrap() >= 0.0, "{r:?}");
    }
    let footer = lines.last().unwrap();
    assert!(
        footer.contains("peak RSS: ") && footer.contains("isa: "),
        "{footer}"
    );
}

/// `--chart FILE` draws the results as an SVG beside the table: a bar per test and thread
/// count with its mean printed on it; an unwritable path is an error naming the flag.
#[test]
fn chart_of_the_results() {
    let m = tiny();
    let svg = scratch("bench-chart").join("bench.svg");
    let (ok, out, err) = mica(&[
        "bench",
        "-m",
        &m,
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "1",
        "-t",
        "1,2",
        "--json",
        "--chart",
        svg.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let recs: Vec<Value> = serde_json::from_str(&out).unwrap();
    let doc = std::fs::read_to_string(&svg).expect("the chart was written");
    assert!(doc.starts_with("<svg") && doc.trim_end().ends_with("</svg>"));
    for part in ["pp8", "tg4", "1 thread", "2 threads", "tokens/s"] {
        assert!(doc.contains(part), "{part} missing from the chart");
    }
    for r in &recs {
        let mean = format!("{:.1}", r["avg_ts"].as_f64().unwrap());
        assert!(doc.contains(&mean), "bar label {mean} missing");
    }
    let (ok, _, err) = mica(&[
        "bench",
        "-m",
        &m,
        "-p",
        "8",
        "-n",
        "0",
        "-r",
        "1",
        "--chart",
        "/nonexistent/dir/x.svg",
    ]);
    assert!(
        !ok && err.contains("--chart /nonexistent/dir/x.svg"),
        "{err}"
    );
}

#[test]
fn bad_flags_are_clear_errors() {
    let m = tiny();
    let cases: [(&[&str], &str); 6] = [
        (&["-t", "0"], "thread counts must be at least 1"),
        (&["-t", "1,,2"], "is not a thread count"),
        (&["-p", ""], "-p needs at least one token count"),
        (&["-p", "12x"], "is not a token count"),
        (&["-p", "0", "-n", "0"], "nothing to measure"),
        (&["-r", "0"], "at least one repetition"),
    ];
    for (extra, want) in cases {
        let mut args = vec!["bench", "-m", &m];
        args.extend_from_slice(extra);
        let (ok, out, err) = mica(&args);
        assert!(!ok, "{args:?} should fail");
        assert!(out.is_empty(), "nothing on stdout for {args:?}: {out}");
        assert!(
            err.starts_with("error: ") && err.contains(want),
            "{args:?}: {err}"
        );
    }
    let (ok, _, err) = mica(&["bench", "-m", "/nonexistent/model.gguf", "-r", "1"]);
    assert!(!ok && err.contains("/nonexistent/model.gguf"), "{err}");
}
