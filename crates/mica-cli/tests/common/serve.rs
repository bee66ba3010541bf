//! `mica serve` in a test: started on a free port with its stderr drained, requests written
//! by hand, signals to stop it and a bounded wait for its exit.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Starts `mica serve -m MODEL --port 0 ARGS...` and waits for its "listening on" line;
/// returns the child and its address. Its stderr is drained from then on, so the server never
/// blocks on a full pipe.
pub fn start(model: &Path, args: &[&str]) -> (Child, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mica"))
        .args(["serve", "-m"])
        .arg(model)
        .args(["--port", "0"])
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("mica serve starts");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "mica serve exited");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    std::thread::spawn(move || {
        let mut sink = String::new();
        let _ = err.read_to_string(&mut sink);
    });
    (child, addr)
}

/// Connects to `a` and sends `POST path` with `body` as JSON (`Connection: close`); the
/// stream reads with a two-minute timeout.
pub fn send_post(a: SocketAddr, path: &str, body: &serde_json::Value) -> TcpStream {
    let mut s = TcpStream::connect(a).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
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
