//! Shared helpers of the mica-hub tests: a one-thread HTTP/1.1 server on 127.0.0.1 that
//! serves files whole, honours `Range` requests, cuts transfers short or answers a bare
//! status, and logs every request; scratch directories; a progress recorder.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use mica_hub::{Event, Phase};
use sha2::{Digest, Sha256};

/// How the server answers one path.
#[derive(Clone)]
pub enum Route {
    /// 200 with the whole body, or 206 with the rest after a `Range: bytes=N-` request
    /// (416 when N is at or past the end).
    Full(Vec<u8>),
    /// 200 announcing the whole body's length, then closing after `n` bytes; every time.
    Cut(Vec<u8>, usize),
    /// Like `Cut` for the first request, then `Full`.
    CutOnce(Vec<u8>, usize),
    /// A JSON document.
    Json(String),
    /// An empty response with this status line.
    Status(&'static str),
}

/// One request the server received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub path: String,
    /// The `Range` header.
    pub range: Option<String>,
    /// The `Authorization` header.
    pub auth: Option<String>,
}

#[derive(Default)]
struct State {
    routes: HashMap<String, Route>,
    log: Vec<Request>,
}

/// A server on an ephemeral port; lives until the test process exits.
pub struct Server {
    pub base: String,
    state: Arc<Mutex<State>>,
}

impl Server {
    pub fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state: Arc<Mutex<State>> = Arc::default();
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = serve(stream, &shared);
            }
        });
        Server { base, state }
    }

    /// Registers `route` at `path`; returns its URL.
    pub fn route(&self, path: &str, route: Route) -> String {
        let mut st = self.state.lock().unwrap();
        st.routes.insert(path.to_string(), route);
        format!("{}{path}", self.base)
    }

    /// Serves `files` as hub repository `repo`, with a file list giving each file's size and
    /// sha256 (the real one unless `sha_override`).
    pub fn repo(&self, repo: &str, files: &[(&str, Route)], sha_override: Option<&str>) {
        let mut siblings = Vec::new();
        for (name, route) in files {
            let bytes = match route {
                Route::Full(b) | Route::Cut(b, _) | Route::CutOnce(b, _) => b,
                Route::Json(_) | Route::Status(_) => unreachable!(),
            };
            let sha = sha_override.map_or_else(|| sha256_hex(bytes), str::to_string);
            siblings.push(serde_json::json!({
                "rfilename": name, "size": bytes.len(),
                "lfs": {"sha256": sha, "size": bytes.len()}
            }));
            self.route(&format!("/{repo}/resolve/main/{name}"), route.clone());
        }
        let json = serde_json::json!({ "id": repo, "siblings": siblings }).to_string();
        self.route(&format!("/api/models/{repo}?blobs=true"), Route::Json(json));
    }

    /// Every request so far.
    pub fn log(&self) -> Vec<Request> {
        self.state.lock().unwrap().log.clone()
    }
}

fn serve(mut stream: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let mut request = Vec::new();
    let mut byte = [0u8; 1];
    while !request.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte)? == 0 {
            return Ok(());
        }
        request.push(byte[0]);
    }
    let request = String::from_utf8_lossy(&request).into_owned();
    let path = request.split_whitespace().nth(1).unwrap_or("/").to_string();
    let header = |name: &str| {
        request.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    let range = header("range");
    let route = {
        let mut st = state.lock().unwrap();
        st.log.push(Request {
            path: path.clone(),
            range: range.clone(),
            auth: header("authorization"),
        });
        let route = st.routes.get(&path).cloned();
        if let Some(Route::CutOnce(bytes, _)) = &route {
            st.routes.insert(path.clone(), Route::Full(bytes.clone()));
        }
        route
    };
    let head = |status: &str, len: usize, extra: &str| {
        format!(
            "HTTP/1.1 {status}\r\nContent-Length: {len}\r\n{extra}Content-Type: application/octet-stream\r\nConnection: close\r\n\r\n"
        )
    };
    match route {
        None => stream.write_all(head("404 Not Found", 0, "").as_bytes())?,
        Some(Route::Status(status)) => stream.write_all(head(status, 0, "").as_bytes())?,
        Some(Route::Json(body)) => {
            stream.write_all(head("200 OK", body.len(), "").as_bytes())?;
            stream.write_all(body.as_bytes())?;
        }
        Some(Route::Cut(bytes, n) | Route::CutOnce(bytes, n)) => {
            stream.write_all(head("200 OK", bytes.len(), "").as_bytes())?;
            stream.write_all(&bytes[..n])?;
        }
        Some(Route::Full(bytes)) => {
            let start = range
                .as_deref()
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.strip_suffix('-'))
                .and_then(|s| s.parse::<usize>().ok());
            match start {
                Some(s) if s >= bytes.len() => {
                    let extra = format!("Content-Range: bytes */{}\r\n", bytes.len());
                    stream.write_all(head("416 Range Not Satisfiable", 0, &extra).as_bytes())?
                }
                Some(s) => {
                    let extra = format!(
                        "Content-Range: bytes {s}-{}/{}\r\n",
                        bytes.len() - 1,
                        bytes.len()
                    );
                    stream.write_all(
                        head("206 Partial Content", bytes.len() - s, &extra).as_bytes(),
                    )?;
                    stream.write_all(&bytes[s..])?;
                }
                None => {
                    stream.write_all(head("200 OK", bytes.len(), "").as_bytes())?;
                    stream.write_all(&bytes)?;
                }
            }
        }
    }
    stream.flush()?;
    stream.shutdown(std::net::Shutdown::Both)
}

/// A fresh empty directory under the system temp dir, removed on drop.
pub struct TestDir(pub PathBuf);

impl TestDir {
    pub fn new(tag: &str) -> TestDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("mica-hub-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TestDir(path)
    }

    /// File names under the directory, recursively and relative to it, sorted (lock files
    /// excluded).
    pub fn names(&self) -> Vec<String> {
        fn walk(base: &std::path::Path, dir: &std::path::Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(base, &p, out);
                } else {
                    out.push(p.strip_prefix(base).unwrap().to_string_lossy().into_owned());
                }
            }
        }
        let mut names = Vec::new();
        walk(&self.0, &self.0, &mut names);
        names.retain(|n| !n.ends_with(".lock"));
        names.sort();
        names
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Asserts that `dir` holds exactly `names` (lock files aside).
pub fn assert_only(dir: &TestDir, names: &[&str]) {
    assert_eq!(
        dir.names(),
        names,
        "unexpected files in {}",
        dir.0.display()
    );
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `n` pseudo-random bytes behind a GGUF magic: incompressible, several reads' worth.
pub fn fake_gguf(n: usize) -> Vec<u8> {
    let mut data = b"GGUF".to_vec();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while data.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(n);
    data
}

/// A progress sink that records what it is told, as owned values.
#[derive(Default)]
pub struct Recorder(pub Mutex<Vec<Recorded>>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    Status(String),
    Start {
        phase: Phase,
        total: Option<u64>,
        done: u64,
    },
    Advance(u64),
    Finish,
}

impl mica_hub::Progress for Recorder {
    fn event(&self, event: Event<'_>) {
        let e = match event {
            Event::Status(s) => Recorded::Status(s.to_string()),
            Event::Start { phase, total, done } => Recorded::Start { phase, total, done },
            Event::Advance(n) => Recorded::Advance(n),
            Event::Finish => Recorded::Finish,
        };
        self.0.lock().unwrap().push(e);
    }
}

impl Recorder {
    pub fn events(&self) -> Vec<Recorded> {
        self.0.lock().unwrap().clone()
    }

    /// Status lines, in order.
    pub fn statuses(&self) -> Vec<String> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Recorded::Status(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    /// Each transfer as (phase, total, done at start + sum of advances), checking that the
    /// events nest properly: `Start`, `Advance`s, `Finish`.
    pub fn transfers(&self) -> Vec<(Phase, Option<u64>, u64)> {
        let mut out = Vec::new();
        let mut open: Option<(Phase, Option<u64>, u64)> = None;
        for e in self.events() {
            match e {
                Recorded::Status(_) => {}
                Recorded::Start { phase, total, done } => {
                    assert!(open.is_none(), "a transfer started inside another");
                    open = Some((phase, total, done));
                }
                Recorded::Advance(n) => open.as_mut().expect("advance outside a transfer").2 += n,
                Recorded::Finish => out.push(open.take().expect("finish without a start")),
            }
        }
        assert!(open.is_none(), "a transfer was never finished");
        out
    }
}
