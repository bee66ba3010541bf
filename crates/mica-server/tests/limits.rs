//! Slow and silent clients are not held: a half-sent body gets 408 (and its connection is
//! closed) within the body timeout, many at once included; a request whose headers never
//! finish and a keep-alive connection left idle are closed; a long generation is never cut
//! by the idle timeout.

mod common;

use common::*;
use mica::engine::SchedulerConfig;
use serde_json::json;
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn short_limits() -> mica_server::ServerConfig {
    let mut cfg = config(SchedulerConfig::default(), vec![]);
    cfg.limits.body_timeout = Duration::from_secs(1);
    cfg.limits.header_timeout = Duration::from_secs(1);
    cfg.limits.idle_timeout = Duration::from_secs(1);
    cfg
}

/// Reads until the server closes the connection; returns how long that took.
fn closed_within(mut s: TcpStream, limit: Duration) -> Duration {
    s.set_read_timeout(Some(limit)).unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return t.elapsed(),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return t.elapsed(),
            Err(e) => panic!("the connection was still open after {limit:?}: {e}"),
        }
    }
}

#[test]
fn a_half_sent_body_times_out() {
    let srv = start(short_limits());
    let a = srv.addr;
    let head = |path: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: {a}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"model\": "
        )
    };
    // Twenty clients at once, each sending 10 of the 100 bytes it announced.
    let t = Instant::now();
    let socks: Vec<TcpStream> = (0..20)
        .map(|i| {
            let path = if i % 2 == 0 {
                "/v1/completions"
            } else {
                "/api/generate"
            };
            send_bytes(a, head(path).as_bytes())
        })
        .collect();
    for (i, s) in socks.into_iter().enumerate() {
        let r = read_response(s);
        assert_eq!(r.status, 408, "{}", r.body);
        assert_eq!(r.header("connection"), Some("close"));
        let v = r.json();
        if i % 2 == 0 {
            assert_eq!(v["error"]["code"], "request_timeout");
        } else {
            assert!(v["error"].as_str().unwrap().contains("did not arrive"));
        }
    }
    let took = t.elapsed();
    assert!(took < Duration::from_secs(6), "408s took {took:?}");
    // And the server serves on.
    let r = post(
        a,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "Hi", "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn unfinished_headers_and_idle_connections_are_closed() {
    let srv = start(short_limits());
    let a = srv.addr;
    // Headers that never end.
    let s = send_bytes(
        a,
        format!("GET /v1/models HTTP/1.1\r\nHost: {a}\r\nX-Slow: ").as_bytes(),
    );
    let took = closed_within(s, Duration::from_secs(5));
    assert!(
        took >= Duration::from_millis(800),
        "closed too early: {took:?}"
    );
    // A connection that never sends anything.
    let s = TcpStream::connect(a).unwrap();
    closed_within(s, Duration::from_secs(5));
    // Keep-alive: a second request soon after the first is served; then idleness closes it.
    let mut s = TcpStream::connect(a).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!("GET /health HTTP/1.1\r\nHost: {a}\r\n\r\n");
    let mut r = BufReader::new(s.try_clone().unwrap());
    for _ in 0..2 {
        s.write_all(req.as_bytes()).unwrap();
        let (status, headers) = read_head(&mut r);
        assert_eq!(status, 200);
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.parse().unwrap())
            .unwrap();
        let mut body = vec![0u8; len];
        r.read_exact(&mut body).unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    let took = closed_within(s, Duration::from_secs(5));
    assert!(
        took < Duration::from_secs(3),
        "idle connection held {took:?}"
    );
}

#[test]
fn a_long_generation_is_not_an_idle_connection() {
    let mut cfg = short_limits();
    cfg.limits.idle_timeout = Duration::from_millis(300);
    let srv = start(cfg);
    let a = srv.addr;
    let t = Instant::now();
    // Greedy counting runs the full length: no bytes move while the answer is generated.
    let r = post(
        a,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "1, 2, 3, 4,", "max_tokens": 200, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["completion_tokens"], 200);
    assert!(
        t.elapsed() > Duration::from_millis(300),
        "the generation should outlast the idle timeout to prove anything ({:?})",
        t.elapsed()
    );
}
