//! Shared by the HTTP tests: a server started in-process on 127.0.0.1 (port 0) with the
//! small test model, and a minimal HTTP/1.1 client over a plain TCP socket (so the tests see
//! the raw framing: status line, chunked encoding, SSE and NDJSON lines).
#![allow(dead_code)]

use mica::engine::SchedulerConfig;
use mica_server::{Access, ApiKey, AppState, ServerConfig};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub const MODEL: &str = "smollm2-135m-instruct-q4_1";

/// A `logit_bias` that bans the test model's end-of-generation tokens (0, 2 and 4 in
/// SmolLM2's vocabulary), for tests that need a sampled generation to still be running when
/// they stop it (cancel, disconnect, shutdown): without it the sampled text may end on its
/// own first, depending on how the CPU's SIMD tier rounds.
pub fn no_eog() -> serde_json::Value {
    serde_json::json!({"0": -100, "2": -100, "4": -100})
}

pub fn model_path() -> PathBuf {
    let dir = std::env::var_os("MICA_TEST_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"));
    let path = dir.join(format!("{MODEL}.gguf"));
    assert!(
        path.is_file(),
        "test model {} is missing: run scripts/fetch-test-models",
        path.display()
    );
    path
}

pub struct Server {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// What `mica_server::serve` returned (`Err` carries its message).
    result: std::sync::mpsc::Receiver<Result<(), String>>,
}

impl Server {
    /// Starts the graceful shutdown (what SIGTERM does in `mica serve`).
    pub fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    /// Waits for `serve` to return, at most `limit`.
    pub fn wait(&mut self, limit: Duration) -> Result<(), String> {
        let r = self
            .result
            .recv_timeout(limit)
            .unwrap_or_else(|_| panic!("serve did not return within {limit:?}"));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        r
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn config(scheduler: SchedulerConfig, api_keys: Vec<ApiKey>) -> ServerConfig {
    ServerConfig {
        access: Access {
            api_keys,
            ..Access::default()
        },
        kv_mem: 64 << 20,
        n_ctx: Some(2048),
        n_threads: 2,
        scheduler,
        max_waiting_per_lane: 64,
        max_loaded: 1,
        repack: true,
        mem_limit: None,
        ..ServerConfig::new(vec![(MODEL.to_string(), model_path())])
    }
}

/// Starts a server and loads the model.
pub fn start(cfg: ServerConfig) -> Server {
    start_with(cfg, Some(MODEL))
}

/// Starts a server, loading `preload` first if given.
pub fn start_with(cfg: ServerConfig, preload: Option<&'static str>) -> Server {
    let state = Arc::new(AppState::new(cfg));
    let st = state.clone();
    let name = preload.map(str::to_string);
    serve_state(state, move || async move {
        if let Some(name) = name {
            st.preload(&name).await.expect("model loads");
        }
    })
}

/// Runs `mica_server::serve` for `state` on its own runtime, after `before` (e.g. a
/// preload) has run.
pub fn serve_state<F, Fut>(state: Arc<AppState>, before: F) -> Server
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    let (res_tx, res_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let st = state.clone();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            before().await;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let r = mica_server::serve(listener, st, async {
                let _ = stop_rx.await;
            })
            .await;
            let _ = res_tx.send(r.map_err(|e| e.to_string()));
        });
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("server starts");
    Server {
        addr,
        state,
        stop: Some(stop_tx),
        thread: Some(thread),
        result: res_rx,
    }
}

pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Opens a connection and sends a request; the response is read by the caller.
pub fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    s
}

/// Reads the status line and headers.
pub fn read_head(r: &mut BufReader<TcpStream>) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    (status, headers)
}

/// Reads one chunk of a chunked body (`None` at the end).
pub fn read_chunk(r: &mut BufReader<TcpStream>) -> Option<String> {
    let mut size = String::new();
    r.read_line(&mut size).ok()?;
    let n = usize::from_str_radix(size.trim(), 16).ok()?;
    if n == 0 {
        return None;
    }
    let mut buf = vec![0u8; n + 2];
    r.read_exact(&mut buf).ok()?;
    buf.truncate(n);
    Some(String::from_utf8_lossy(&buf).into_owned())
}

pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Resp {
    read_response(send(addr, method, path, headers, body))
}

/// Reads a whole response (chunked or to the end of the connection).
pub fn read_response(s: TcpStream) -> Resp {
    let mut r = BufReader::new(s);
    let (status, hs) = read_head(&mut r);
    let chunked = hs
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        let mut b = String::new();
        while let Some(c) = read_chunk(&mut r) {
            b.push_str(&c);
        }
        b
    } else {
        let mut b = String::new();
        r.read_to_string(&mut b).unwrap();
        b
    };
    Resp {
        status,
        headers: hs,
        body,
    }
}

/// Writes raw request bytes on a new connection.
pub fn send_bytes(addr: SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    s.write_all(bytes).unwrap();
    s
}

/// A request with exactly `headers` (no Content-Type added; `Host` only when not given).
pub fn request_raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Resp {
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    req.push_str(&format!(
        "Connection: close\r\nContent-Length: {}\r\n",
        body.len()
    ));
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    read_response(send_bytes(addr, req.as_bytes()))
}

/// A JSON POST with a chunked body (no Content-Length).
pub fn post_chunked(addr: SocketAddr, path: &str, body: &str) -> Resp {
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    read_response(send_bytes(addr, req.as_bytes()))
}

pub fn post(addr: SocketAddr, path: &str, body: &serde_json::Value) -> Resp {
    request(addr, "POST", path, &[], &body.to_string())
}

pub fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, &[], "")
}

/// The value of a metric line `name{...labels containing filter...} value`.
pub fn metric(addr: SocketAddr, name: &str, filter: &str) -> f64 {
    metric_with(addr, &[], name, filter)
}

/// [`metric`] with request headers (an API key).
pub fn metric_with(addr: SocketAddr, headers: &[(&str, &str)], name: &str, filter: &str) -> f64 {
    let m = request(addr, "GET", "/metrics", headers, "").body;
    m.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with('{') && l.contains(filter))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} {filter} missing:\n{m}"))
}
