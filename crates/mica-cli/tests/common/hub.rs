//! A local HTTP server that lays files out as the model hub does
//! (`/{org}/{repo}/resolve/main/{file}`, `/api/models/{org}/{repo}` for the file list with
//! LFS sha256s), reached through `MICA_HF_ENDPOINT`. It honours `Range` requests, can cut a
//! transfer short once or send a file slowly, and records every request.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// How the server answers a file path.
#[derive(Clone)]
pub enum Route {
    /// The bytes, honouring `Range`.
    File(Vec<u8>),
    /// Like `File`, but the first request gets only this many bytes before the connection
    /// closes (announcing the whole length).
    CutOnce(Vec<u8>, usize),
    /// A JSON document.
    Json(String),
    /// Like `File` (without `Range`), sent `chunk` bytes at a time with `pause_ms` between
    /// chunks, so that a client's progress can be watched.
    Slow(Vec<u8>, usize, u64),
}

#[derive(Default)]
pub struct State {
    pub routes: HashMap<String, Route>,
    /// (path, Range header) of every request.
    pub log: Vec<(String, Option<String>)>,
}

pub struct Server {
    pub base: String,
    pub state: Arc<Mutex<State>>,
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

    pub fn route(&self, path: &str, route: Route) {
        self.state
            .lock()
            .unwrap()
            .routes
            .insert(path.to_string(), route);
    }

    /// Serves `files` as repository `repo`, with a file list giving `sha256s` (the real
    /// ones unless overridden).
    pub fn repo(&self, repo: &str, files: &[(&str, Route)], sha_override: Option<&str>) {
        let mut siblings = Vec::new();
        for (name, route) in files {
            let bytes = match route {
                Route::File(b) | Route::CutOnce(b, _) | Route::Slow(b, ..) => b,
                Route::Json(_) => unreachable!(),
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

    pub fn log(&self) -> Vec<(String, Option<String>)> {
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
    let range = request.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("range")
            .then(|| v.trim().to_string())
    });
    let route = {
        let mut st = state.lock().unwrap();
        st.log.push((path.clone(), range.clone()));
        let route = st.routes.get(&path).cloned();
        // A cut happens once; later requests get the whole file.
        if let Some(Route::CutOnce(bytes, _)) = &route {
            st.routes.insert(path.clone(), Route::File(bytes.clone()));
        }
        route
    };
    let head = |status: &str, len: usize, extra: &str| {
        format!("HTTP/1.1 {status}\r\nContent-Length: {len}\r\n{extra}Connection: close\r\n\r\n")
    };
    match route {
        None => stream.write_all(head("404 Not Found", 0, "").as_bytes())?,
        Some(Route::Json(body)) => {
            stream.write_all(
                head("200 OK", body.len(), "Content-Type: application/json\r\n").as_bytes(),
            )?;
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
        Some(Route::CutOnce(bytes, n)) => {
            stream.write_all(head("200 OK", bytes.len(), "").as_bytes())?;
            stream.write_all(&bytes[..n])?;
        }
        Some(Route::File(bytes)) => {
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
