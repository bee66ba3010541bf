//! A one-thread HTTP/1.1 server on 127.0.0.1 that lays files out as the model hub does
//! (`/{org}/{repo}/resolve/main/{file}`, `/api/models/{org}/{repo}?blobs=true` for the file
//! list with sizes and LFS sha256s, reached through `MICA_HF_ENDPOINT`) or at any path. It
//! serves files whole, honours `Range` requests, cuts transfers short, sends a file slowly or
//! answers a bare status, and logs every request. Shared by the mica-hub tests and, through
//! `#[path]`, the mica-cli tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

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
    /// 200 with the whole body (no `Range`), sent `chunk` bytes at a time with `pause_ms`
    /// between chunks, so that a client's progress can be watched.
    Slow(Vec<u8>, usize, u64),
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
                Route::Full(b) | Route::Cut(b, _) | Route::CutOnce(b, _) | Route::Slow(b, ..) => b,
                Route::Json(_) | Route::Status(_) => unreachable!(),
            };
            let sha = sha_override.map_or_else(|| sha256_hex(bytes), str::to_string);
            siblings.push(serde_json::json!({
                "rfilename": name, "size": bytes.len(),
                "lfs": {"sha256": sha, "size": bytes.len(), "pointerSize": 134}
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
    let kind = if matches!(route, Some(Route::Json(_))) {
        "application/json"
    } else {
        "application/octet-stream"
    };
    let head = |status: &str, len: usize, extra: &str| {
        format!(
            "HTTP/1.1 {status}\r\nContent-Length: {len}\r\n{extra}Content-Type: {kind}\r\nConnection: close\r\n\r\n"
        )
    };
    match route {
        None => stream.write_all(head("404 Not Found", 0, "").as_bytes())?,
        Some(Route::Status(status)) => stream.write_all(head(status, 0, "").as_bytes())?,
        Some(Route::Json(body)) => {
            stream.write_all(head("200 OK", body.len(), "").as_bytes())?;
            stream.write_all(body.as_bytes())?;
        }
        Some(Route::Slow(bytes, chunk, pause_ms)) => {
            stream.write_all(head("200 OK", bytes.len(), "").as_bytes())?;
            for part in bytes.chunks(chunk.max(1)) {
                stream.write_all(part)?;
                stream.flush()?;
                std::thread::sleep(std::time::Duration::from_millis(pause_ms));
            }
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

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
