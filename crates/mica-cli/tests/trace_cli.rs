//! `--trace FILE` through the real binary, `mica run` and `mica serve`: the file is a Chrome
//! trace-event JSON array whose spans nest step → forward → layer → attention /
//! feed_forward → matmul on one thread (each child inside its parent's time, the parts
//! adding up to at most the whole), with the loading and tokenizer spans, the arguments
//! (batch composition, matrix shapes and types), and the compute pool's workers on tracks of
//! their own. `mica trace-chart` draws such a file as an SVG flame chart.

mod common;

use common::serve::{send_post, signal, wait_exit};
use common::*;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Child;
use std::time::Duration;

const MODEL: &str = "smollm2-135m-instruct-q4_1";
const LAYERS: usize = 30;

/// One span occurrence: a B/E pair on one thread.
#[derive(Debug)]
struct Span {
    name: String,
    tid: i64,
    start: f64,
    end: f64,
    /// The span open around it on its thread when it began.
    parent: Option<usize>,
    /// Arguments at its end (fields recorded late included).
    args: Value,
}

impl Span {
    fn dur(&self) -> f64 {
        self.end - self.start
    }
    fn arg(&self, k: &str) -> Option<&str> {
        self.args[k].as_str()
    }
    /// Asserts that argument `k` was recorded as `v`.
    fn expect_arg(&self, k: &str, v: &str) {
        assert_eq!(
            self.arg(k),
            Some(v),
            "`{}`'s {k}: {:?}",
            self.name,
            self.args
        );
    }
    /// Whether `inner` runs within this span's time.
    fn contains(&self, inner: &Span) -> bool {
        self.start <= inner.start && inner.end <= self.end
    }
}

struct Trace {
    spans: Vec<Span>,
    threads: HashMap<i64, String>,
}

impl Trace {
    /// Parses the file as Chrome trace JSON and pairs every B with its E, in order, per
    /// thread (an E must close the innermost open span of its name).
    fn read(path: &Path) -> Trace {
        let text = std::fs::read_to_string(path).unwrap();
        let events: Vec<Value> = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not a JSON array: {e}", path.display()));
        let mut spans: Vec<Span> = Vec::new();
        let mut open: HashMap<i64, Vec<usize>> = HashMap::new();
        let mut threads = HashMap::new();
        for e in &events {
            let tid = e["tid"].as_i64().expect("tid");
            let name = e["name"].as_str().expect("name").to_string();
            match e["ph"].as_str().expect("ph") {
                "M" => {
                    assert_eq!(name, "thread_name");
                    threads.insert(tid, e["args"]["name"].as_str().unwrap().to_string());
                }
                "B" => {
                    let stack = open.entry(tid).or_default();
                    spans.push(Span {
                        name,
                        tid,
                        start: e["ts"].as_f64().expect("ts"),
                        end: f64::NAN,
                        parent: stack.last().copied(),
                        args: Value::Null,
                    });
                    stack.push(spans.len() - 1);
                }
                "E" => {
                    let i = open.get_mut(&tid).and_then(Vec::pop).expect("E without B");
                    assert_eq!(spans[i].name, name, "E closes another span than its B");
                    spans[i].end = e["ts"].as_f64().expect("ts");
                    spans[i].args = e["args"].clone();
                }
                ph => panic!("unexpected phase {ph}"),
            }
        }
        assert!(
            open.values().all(Vec::is_empty),
            "spans left open: the trace was not flushed"
        );
        Trace { spans, threads }
    }

    fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = (usize, &'a Span)> + 'a {
        self.spans
            .iter()
            .enumerate()
            .filter(move |(_, s)| s.name == name)
    }

    fn count(&self, name: &str) -> usize {
        self.named(name).count()
    }

    fn parent(&self, s: &Span) -> Option<&Span> {
        s.parent.map(|p| &self.spans[p])
    }

    /// Every `name` span sits, on its own thread and within its time, inside a span of one
    /// of `parents`.
    fn nested_in(&self, name: &str, parents: &[&str]) {
        assert!(self.count(name) > 0, "no `{name}` span");
        for (_, s) in self.named(name) {
            let p = self
                .parent(s)
                .unwrap_or_else(|| panic!("`{name}` at {} has no parent", s.start));
            assert!(
                parents.contains(&p.name.as_str()),
                "`{name}` inside `{}`, not {parents:?}",
                p.name
            );
            assert_eq!(p.tid, s.tid);
            assert!(
                p.contains(s),
                "`{name}` [{}, {}] outside its `{}` [{}, {}]",
                s.start,
                s.end,
                p.name,
                p.start,
                p.end
            );
        }
    }

    /// For each `whole` span, the `part` spans directly inside it take at most its time.
    fn parts_fit(&self, part: &str, whole: &str) {
        for (i, w) in self.named(whole) {
            let sum: f64 = self
                .named(part)
                .filter(|(_, s)| s.parent == Some(i))
                .map(|(_, s)| s.dur())
                .sum();
            assert!(
                sum <= w.dur() + 1e-6,
                "`{part}` spans add up to {sum} µs, more than their `{whole}`'s {} µs",
                w.dur()
            );
        }
    }
}

/// `mica run -m MODEL ARGS...`.
fn run_model(args: &[&str]) -> (bool, String, String) {
    let m = model_path(MODEL);
    let mut all = vec!["run", "-m", m.to_str().unwrap()];
    all.extend_from_slice(args);
    mica(&all)
}

/// `mica trace-chart TRACE -o SVG`.
fn trace_chart(trace: &Path, svg: &Path) -> (bool, String, String) {
    mica(&[
        "trace-chart",
        trace.to_str().unwrap(),
        "-o",
        svg.to_str().unwrap(),
    ])
}

fn run_trace(dir: &Path, threads: &str) -> std::path::PathBuf {
    let out = dir.join("run.json");
    let (ok, _, err) = run_model(&[
        "-p",
        "Hello",
        "-n",
        "3",
        "--temp",
        "0",
        "-t",
        threads,
        "--trace",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    out
}

#[test]
fn run_writes_a_chrome_trace_of_nested_spans() {
    let out = run_trace(&scratch("trace-run"), "2");
    let t = Trace::read(&out);

    // Three tokens: the prompt's pass and two decode steps, 30 layers each.
    assert_eq!(t.count("step"), 3);
    assert_eq!(t.count("forward"), 3);
    assert_eq!(t.count("layer"), 3 * LAYERS);
    assert_eq!(t.count("attention"), 3 * LAYERS);
    assert_eq!(t.count("feed_forward"), 3 * LAYERS);

    // step → forward → layer → attention / feed_forward → matmul, by time on one thread.
    t.nested_in("forward", &["step"]);
    t.nested_in("layer", &["forward"]);
    t.nested_in("attention", &["layer"]);
    t.nested_in("feed_forward", &["layer"]);
    // The output head's product runs in the forward pass after the last layer.
    t.nested_in("matmul", &["attention", "feed_forward", "forward"]);
    for part in ["attention", "feed_forward"] {
        assert!(
            t.named("matmul")
                .any(|(_, s)| t.parent(s).unwrap().name == part),
            "no matmul inside {part}"
        );
    }
    t.parts_fit("layer", "forward");
    t.parts_fit("forward", "step");
    t.parts_fit("attention", "layer");

    // Arguments: the step's composition, the product's shape and type.
    let (_, step) = t.named("step").next().unwrap();
    step.expect_arg("sequences", "1");
    step.expect_arg("tokens", "1");
    let (_, mm) = t.named("matmul").next().unwrap();
    mm.expect_arg("dtype", "\"Q4_1\"");
    for k in ["rows", "cols", "tokens"] {
        assert!(
            mm.arg(k).is_some_and(|v| v.parse::<usize>().is_ok()),
            "{k}: {:?}",
            mm.args
        );
    }

    // Loading and the tokenizer.
    for name in [
        "load_model",
        "open_file",
        "build_tokenizer",
        "build_model",
        "repack",
    ] {
        assert_eq!(t.count(name), 1, "{name}");
    }
    for name in ["open_file", "build_tokenizer", "build_model"] {
        t.nested_in(name, &["load_model"]);
    }
    assert!(t.count("tokenize") >= 1);
    let (_, tok) = t.named("tokenize").next().unwrap();
    assert!(tok.arg("tokens").is_some(), "{:?}", tok.args);
    assert!(t.count("detokenize") >= 3);

    // The compute pool: a track for the worker, named, with its share of each job.
    let main = step.tid;
    assert_eq!(t.threads[&main], "main");
    let workers: Vec<&Span> = t
        .named("pool_job")
        .map(|(_, s)| s)
        .filter(|s| s.tid != main)
        .collect();
    assert!(!workers.is_empty(), "no pool_job on a worker thread");
    assert!(
        workers
            .iter()
            .all(|s| t.threads[&s.tid] == "mica-compute-1" && s.parent.is_none())
    );
    assert!(
        workers.iter().any(|s| s
            .arg("chunks")
            .is_some_and(|c| c.parse::<usize>().unwrap() >= 1)),
        "no pool_job recorded its chunks"
    );
    // The calling thread's share of a job runs inside the operation that gave it.
    for (_, s) in t.named("pool_job").filter(|(_, s)| s.tid == main) {
        let p = t
            .parent(s)
            .expect("the main thread's pool_job has a parent");
        assert!(p.contains(s));
    }
}

#[test]
fn single_thread_run_has_no_worker_tracks() {
    let out = run_trace(&scratch("trace-run-1t"), "1");
    let t = Trace::read(&out);
    assert_eq!(t.count("forward"), 3);
    assert_eq!(t.count("pool_job"), 0);
    assert_eq!(t.threads.len(), 1, "{:?}", t.threads);
}

#[test]
fn trace_chart_draws_an_svg_flame_chart() {
    let dir = scratch("trace-chart");
    let out = run_trace(&dir, "2");
    let svg = dir.join("chart.svg");
    let (ok, stdout, err) = trace_chart(&out, &svg);
    assert!(ok, "{err}");
    // The table: every span name with its count.
    for (name, count) in [("step", 3), ("forward", 3), ("layer", 90)] {
        let line = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} missing from\n{stdout}"));
        assert_eq!(
            line.split_whitespace().nth(1),
            Some(&*count.to_string()),
            "{line}"
        );
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("the chart is XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let labels: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|s| s.trim().to_string())
        .collect();
    for name in [
        "main",
        "step",
        "forward",
        "layer",
        "feed_forward",
        "load_model",
    ] {
        // A rectangle's width is its span's share of the run's time, which varies from run
        // to run: a narrow one shows its name cut short ("feed_forw…").
        let shows = |l: &String| {
            l.split_whitespace().next() == Some(name)
                || l.strip_suffix('…')
                    .is_some_and(|p| p.chars().count() >= 3 && name.starts_with(p))
        };
        assert!(
            labels.iter().any(shows),
            "no label for {name} in {labels:?}"
        );
    }
    let rects = doc.descendants().filter(|n| n.has_tag_name("rect")).count();
    assert!(rects > 10, "{rects} rectangles");
}

#[test]
fn trace_chart_rejects_what_is_not_a_trace() {
    let dir = scratch("trace-chart-bad");
    let svg = dir.join("chart.svg");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "[{\"ph\":\"B\"").unwrap();
    let (ok, _, err) = trace_chart(&bad, &svg);
    assert!(!ok);
    assert!(err.contains("not a Chrome trace"), "{err}");
    std::fs::write(&bad, "[]").unwrap();
    let (ok, _, err) = trace_chart(&bad, &svg);
    assert!(!ok);
    assert!(err.contains("no spans"), "{err}");
    let missing = dir.join("missing.json");
    let (ok, _, err) = trace_chart(&missing, &svg);
    assert!(!ok);
    assert!(err.contains("cannot read"), "{err}");
    assert!(!svg.exists());
}

#[test]
fn trace_to_an_unwritable_path_fails_clearly() {
    let (ok, _, err) = run_model(&["-p", "Hi", "-n", "1", "--trace", "/nonexistent-dir/x.json"]);
    assert!(!ok);
    assert!(err.contains("--trace: cannot create"), "{err}");
}

/// Starts `mica serve --trace FILE` on a free port; returns the child and its address once
/// it listens.
fn serve_traced(trace: &Path) -> (Child, SocketAddr) {
    common::serve::start(
        &model_path(MODEL),
        &[
            "-t",
            "2",
            "-c",
            "1024",
            "--kv-mem",
            "64M",
            "--trace",
            trace.to_str().unwrap(),
        ],
    )
}

fn post(a: SocketAddr, path: &str, body: &Value) -> String {
    let mut out = String::new();
    send_post(a, path, body).read_to_string(&mut out).unwrap();
    out
}

#[test]
fn serve_writes_a_complete_trace_on_sigterm() {
    let trace = scratch("trace-serve").join("serve.json");
    let (mut child, addr) = serve_traced(&trace);
    let resp = post(
        addr,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4, "temperature": 0}),
    );
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    signal(&child, libc::SIGTERM);
    let status = wait_exit(&mut child, Duration::from_secs(60));
    assert!(status.success(), "{status:?}");

    // The file is closed JSON with every span ended.
    let t = Trace::read(&trace);
    for name in [
        "load_model",
        "chat_template",
        "tokenize",
        "schedule",
        "execute",
        "update",
    ] {
        assert!(t.count(name) >= 1, "no `{name}` span");
    }
    // The engine's steps: prompt, then decodes; its own thread; the forward in `execute`.
    t.nested_in("schedule", &["step"]);
    t.nested_in("execute", &["step"]);
    t.nested_in("forward", &["execute"]);
    t.nested_in("layer", &["forward"]);
    t.parts_fit("forward", "execute");
    let steps: Vec<&Span> = t
        .named("step")
        .map(|(_, s)| s)
        .filter(|s| s.arg("sequences").is_some_and(|n| n != "0"))
        .collect();
    assert!(steps.len() >= 4, "{} steps", steps.len());
    let prompt = steps[0];
    prompt.expect_arg("sequences", "1");
    prompt.expect_arg("decodes", "0");
    prompt.expect_arg("interactive", "1");
    let n: usize = prompt.arg("prompt_tokens").unwrap().parse().unwrap();
    assert!(n > 1 && prompt.arg("tokens") == Some(&*n.to_string()));
    let decode = steps[1];
    decode.expect_arg("decodes", "1");
    decode.expect_arg("tokens", "1");
    assert_ne!(t.threads[&prompt.tid], "main");
}
