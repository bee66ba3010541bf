//! `mica serve` in a test: started on a free port with its stderr drained, requests written
//! by hand, signals to stop it and a bounded wait for its exit.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Starts `mica serve -m MODEL --port 0 ARGS...` and waits for its "listening on" line;
/// returns the child and its address. Its stderr is drained from then on, so the server never
/// blocks on a full pipe.
pub fn start(model: &Path, args: &[&str]) -> (Child, SocketAddr) {
    let (child, addr, _) = start_logged(model, args);
    (child, addr)
}

/// The lines a server wrote to stderr, collected while it runs.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    /// Every line so far (the "listening" line included), without line ends.
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// [`start`], keeping what the server writes to stderr: the "listening" line may be plain
/// text or, with `--log-format json`, a JSON object with its `address`.
pub fn start_logged(model: &Path, args: &[&str]) -> (Child, SocketAddr, Log) {
    start_serving(("-m", model), args)
}

/// [`start_logged`] with `--models-dir DIR` instead of `-m MODEL`.
pub fn start_dir_logged(dir: &Path, args: &[&str]) -> (Child, SocketAddr, Log) {
    start_serving(("--models-dir", dir), args)
}

fn start_serving((flag, what): (&str, &Path), args: &[&str]) -> (Child, SocketAddr, Log) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mica"))
        .args(["serve", flag])
        .arg(what)
        .args(["--port", "0"])
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("mica serve starts");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let log = Log::default();
    let mut line = String::new();
    let addr = loop {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "mica serve exited");
        log.0.lock().unwrap().push(line.trim_end().to_string());
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
            && v["event"] == "listening"
        {
            let a = v["address"].as_str().expect("the address");
            break a.trim_start_matches("http://").parse().unwrap();
        }
    };
    let keep = log.clone();
    std::thread::spawn(move || {
        for line in err.lines() {
            let Ok(line) = line else { break };
            keep.0.lock().unwrap().push(line);
        }
    });
    (child, addr, log)
}

/// The status code of `GET path` (0 when the server cannot be reached).
pub fn get_status(a: SocketAddr, path: &str) -> u16 {
    let Ok(mut s) = TcpStream::connect(a) else {
        return 0;
    };
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// Waits (two minutes at most) until `/ready` answers 200.
pub fn wait_ready(a: SocketAddr) {
    let t = Instant::now();
    while get_status(a, "/ready") != 200 {
        assert!(t.elapsed() < Duration::from_secs(120), "never ready");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Connects to `a` and sends `POST path` with `body` as JSON (`Connection: close`); the
/// stream reads with a two-minute timeout.
pub fn send_post(a: SocketAddr, path: &str, body: &serde_json::Value) -> TcpStream {
    send_post_with(a, path, body, "")
}

/// [`send_post`] with more header lines (`extra`, each ending in `\r\n`).
pub fn send_post_with(
    a: SocketAddr,
    path: &str,
    body: &serde_json::Value,
    extra: &str,
) -> TcpStream {
    let mut s = TcpStream::connect(a).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

/// Sends `sig` (e.g. `libc::SIGTERM`) to the server.
pub fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: sending a signal to our own child.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({}, {sig})", child.id());
}

/// Waits for the server to exit; kills it and fails the test after `limit`.
pub fn wait_exit(child: &mut Child, limit: Duration) -> ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("mica serve did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
