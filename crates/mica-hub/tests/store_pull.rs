//! The store's API against a local server laid out as the model hub
//! (`/{org}/{repo}/resolve/main/{file}`, `/api/models/{org}/{repo}?blobs=true`): pulls that
//! resume from a `.part` file, checksum failures that leave nothing behind, progress events
//! that account for every byte, typed errors, and list / find / resolve / remove.

mod common;

use common::{Recorded, Recorder, Route, Server, TestDir, assert_only, fake_gguf};
use mica_hub::{Error, Hub, HubConfig, Kind, Phase, Store};

/// A client for `server` with `token`.
fn hub_at(server: &Server, token: Option<&str>) -> Hub {
    Hub::new(HubConfig {
        endpoint: server.base.clone(),
        token: token.map(str::to_string),
        ca_file: None,
    })
}

/// The requests for `file`'s bytes (not the file list), as their Range headers.
fn ranges(server: &Server, file: &str) -> Vec<Option<String>> {
    server
        .log()
        .into_iter()
        .filter(|r| r.path.ends_with(&format!("/resolve/main/{file}")))
        .map(|r| r.range)
        .collect()
}

#[test]
fn pull_resumes_from_a_partial_file_and_reports_every_byte() {
    let server = Server::start();
    let model = fake_gguf(700_000);
    server.repo("org/r", &[("m.gguf", Route::Full(model.clone()))], None);
    let dir = TestDir::new("resume");
    let store = Store::open(&dir.0);
    // A previous attempt got the first 300,001 bytes.
    let repo_dir = dir.0.join("hf/org/r");
    std::fs::create_dir_all(&repo_dir).unwrap();
    let have = 300_001;
    std::fs::write(repo_dir.join("m.gguf.part"), &model[..have]).unwrap();

    let progress = Recorder::default();
    let path = store
        .pull("hf:org/r:m.gguf", &hub_at(&server, None), Some(&progress))
        .unwrap();
    assert_eq!(path, repo_dir.join("m.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), model, "byte-identical");
    assert_only(&dir, &["hf/org/r/m.gguf"]);
    assert_eq!(ranges(&server, "m.gguf"), [Some(format!("bytes={have}-"))]);
    // One transfer: it starts at what was there, and its advances bring it to the size.
    let len = model.len() as u64;
    assert_eq!(
        progress.transfers(),
        [(Phase::Pulling, Some(len), len)],
        "{:?}",
        progress.events()
    );
    assert!(progress.events().contains(&Recorded::Start {
        phase: Phase::Pulling,
        total: Some(len),
        done: have as u64,
    }));
    let statuses = progress.statuses();
    assert!(
        statuses.iter().any(|s| s.starts_with("resuming m.gguf at")),
        "{statuses:?}"
    );
    assert_eq!(
        statuses.last().unwrap(),
        &format!("saved {}", path.display())
    );
}

#[test]
fn an_interrupted_pull_keeps_its_part_and_the_next_one_finishes_it() {
    let server = Server::start();
    let model = fake_gguf(500_000);
    let cut = 123_456;
    server.repo(
        "org/r",
        &[("m.gguf", Route::CutOnce(model.clone(), cut))],
        None,
    );
    let dir = TestDir::new("cut");
    let store = Store::open(&dir.0);
    let hub = hub_at(&server, None);

    let progress = Recorder::default();
    let err = store
        .pull("hf:org/r:m.gguf", &hub, Some(&progress))
        .unwrap_err();
    match &err {
        Error::Interrupted {
            url, got, total, ..
        } => {
            assert!(url.ends_with("/org/r/resolve/main/m.gguf"), "{url}");
            assert_eq!((*got, *total), (cut as u64, Some(model.len() as u64)));
        }
        e => panic!("expected Interrupted, got {e:?}"),
    }
    assert!(err.to_string().contains("again to resume"), "{err}");
    assert_only(&dir, &["hf/org/r/m.gguf.part"]);
    // The failed transfer was still closed, and counted what arrived.
    let len = model.len() as u64;
    assert_eq!(
        progress.transfers(),
        [(Phase::Pulling, Some(len), cut as u64)]
    );

    let progress = Recorder::default();
    store
        .pull("hf:org/r:m.gguf", &hub, Some(&progress))
        .unwrap();
    assert_eq!(std::fs::read(dir.0.join("hf/org/r/m.gguf")).unwrap(), model);
    assert_only(&dir, &["hf/org/r/m.gguf"]);
    assert_eq!(progress.transfers(), [(Phase::Pulling, Some(len), len)]);
    assert_eq!(
        ranges(&server, "m.gguf"),
        [None, Some(format!("bytes={cut}-"))]
    );

    // Pulled again: found in place, nothing fetched.
    let before = server.log().len();
    let progress = Recorder::default();
    store
        .pull("hf:org/r:m.gguf", &hub, Some(&progress))
        .unwrap();
    assert!(progress.transfers().is_empty());
    assert_eq!(progress.statuses(), ["hf:org/r is already in the store"]);
    assert_eq!(
        server.log().len(),
        before + 1,
        "only the file list was asked for"
    );
}

#[test]
fn a_checksum_mismatch_leaves_nothing_in_place() {
    let server = Server::start();
    let model = fake_gguf(200_000);
    let wrong = "ab".repeat(32);
    server.repo(
        "org/bad",
        &[("m.gguf", Route::Full(model.clone()))],
        Some(&wrong),
    );
    let dir = TestDir::new("sha");
    let store = Store::open(&dir.0);
    let hub = hub_at(&server, None);
    let err = store.pull("hf:org/bad:m.gguf", &hub, None).unwrap_err();
    match &err {
        Error::RejectedSha256 { expected, got, .. } => {
            assert_eq!(expected, &wrong);
            assert_eq!(got, &common::sha256_hex(&model));
        }
        e => panic!("expected RejectedSha256, got {e:?}"),
    }
    assert!(err.to_string().contains("deleted"), "{err}");
    assert_only(&dir, &[]);

    // The same when the bad bytes were partly there already: the part is deleted too, so
    // the next attempt starts over.
    let repo_dir = dir.0.join("hf/org/bad");
    std::fs::create_dir_all(&repo_dir).unwrap();
    std::fs::write(repo_dir.join("m.gguf.part"), &model[..1000]).unwrap();
    let err = store.pull("hf:org/bad:m.gguf", &hub, None).unwrap_err();
    assert!(matches!(err, Error::RejectedSha256 { .. }), "{err:?}");
    assert_only(&dir, &[]);
    assert_eq!(
        ranges(&server, "m.gguf"),
        [None, Some("bytes=1000-".into())]
    );
}

#[test]
fn hub_errors_are_typed_and_name_what_failed() {
    let server = Server::start();
    let dir = TestDir::new("errors");
    let store = Store::open(&dir.0);
    let hub = hub_at(&server, None);
    let err = |name: &str| store.pull(name, &hub, None).unwrap_err();

    assert!(matches!(err("hf:org/nothing"), Error::RepoNotFound { repo } if repo == "org/nothing"));
    server.route(
        "/api/models/org/gated?blobs=true",
        Route::Status("403 Forbidden"),
    );
    assert!(matches!(
        err("hf:org/gated"),
        Error::Refused { what, status: 403 } if what == "hf:org/gated"
    ));
    server.repo("org/r", &[("a.gguf", Route::Full(vec![1, 2, 3]))], None);
    assert!(matches!(
        err("hf:org/r:b.gguf"),
        Error::NoSuchFile { repo, file } if repo == "org/r" && file == "b.gguf"
    ));
    assert!(matches!(err("hf:nope"), Error::BadHubName { .. }));
    match err("qwen3") {
        Error::NotInCatalog { name, similar } => {
            assert_eq!(name, "qwen3");
            assert!(similar.contains(&"qwen3-0.6b"), "{similar:?}");
        }
        e => panic!("{e:?}"),
    }
    server.repo(
        "org/many",
        &[
            ("a-Q8_0.gguf", Route::Full(vec![1])),
            ("a-F16.gguf", Route::Full(vec![2])),
        ],
        None,
    );
    match err("hf:org/many") {
        Error::SeveralGguf { repo, files } => {
            assert_eq!(repo, "org/many");
            assert_eq!(files.len(), 2);
        }
        e => panic!("{e:?}"),
    }
    assert_only(&dir, &[]);
}

#[test]
fn the_token_goes_to_the_hub() {
    let server = Server::start();
    server.repo(
        "org/private",
        &[("m.gguf", Route::Full(fake_gguf(1000)))],
        None,
    );
    let dir = TestDir::new("token");
    Store::open(&dir.0)
        .pull("hf:org/private", &hub_at(&server, Some("secret")), None)
        .unwrap();
    let log = server.log();
    assert_eq!(log.len(), 2, "{log:?}");
    assert!(
        log.iter()
            .all(|r| r.auth.as_deref() == Some("Bearer secret")),
        "{log:?}"
    );
}

#[test]
fn list_find_resolve_and_remove() {
    let server = Server::start();
    let model = fake_gguf(4096);
    server.repo(
        "org/st",
        &[
            ("model.safetensors", Route::Full(vec![7; 1000])),
            ("config.json", Route::Full(b"{}".to_vec())),
            ("README.md", Route::Full(b"hi".to_vec())),
        ],
        None,
    );
    server.repo("org/g", &[("tiny.gguf", Route::Full(model.clone()))], None);
    let dir = TestDir::new("store");
    let store = Store::open(&dir.0);
    let hub = hub_at(&server, None);
    assert!(
        store.list().unwrap().is_empty(),
        "a missing directory is empty"
    );

    // A name that is not stored yet is pulled; then it resolves without the network.
    let progress = Recorder::default();
    let path = store.resolve("hf:org/g", &hub, Some(&progress)).unwrap();
    assert_eq!(path, dir.0.join("hf/org/g/tiny.gguf"));
    assert_eq!(
        progress.statuses()[0],
        "hf:org/g is not in the store yet; pulling it"
    );
    let before = server.log().len();
    for name in [
        "hf:org/g:tiny.gguf",
        "tiny",
        "tiny.gguf",
        "HF:ORG/G:TINY.GGUF",
    ] {
        assert_eq!(store.resolve(name, &hub, None).unwrap(), path, "{name}");
    }
    assert_eq!(server.log().len(), before, "no requests for stored models");
    assert_eq!(
        store.pull("hf:org/st", &hub, None).unwrap(),
        dir.0.join("hf/org/st")
    );
    std::fs::write(dir.0.join("local.gguf"), b"GGUF").unwrap();
    std::fs::write(dir.0.join("local.gguf.part"), b"GG").unwrap();
    std::fs::write(dir.0.join(".hidden.gguf"), b"GGUF").unwrap();

    let all = store.list().unwrap();
    let summary: Vec<_> = all
        .iter()
        .map(|m| (m.name.as_str(), m.kind, m.size))
        .collect();
    assert_eq!(
        summary,
        [
            ("hf:org/g:tiny.gguf", Kind::Gguf, 4096),
            ("hf:org/st", Kind::Safetensors, 1002),
            ("local", Kind::Gguf, 4),
        ]
    );
    // An existing path is taken as it is; unknown names and empty names are errors.
    let file = dir.0.join("local.gguf");
    assert_eq!(
        store.resolve(file.to_str().unwrap(), &hub, None).unwrap(),
        file
    );
    assert!(matches!(
        store.resolve("nothing-like-it", &hub, None),
        Err(Error::NotFound { arg }) if arg == "nothing-like-it"
    ));
    assert!(matches!(
        store.resolve(" ", &hub, None),
        Err(Error::EmptyName)
    ));

    // Two stored models whose names end in the same file stem: ambiguous.
    std::fs::create_dir_all(dir.0.join("hf/other/x")).unwrap();
    std::fs::write(dir.0.join("hf/other/x/tiny.gguf"), b"GGUF").unwrap();
    match store.find("tiny") {
        Err(Error::Ambiguous { name, matches }) => {
            assert_eq!(name, "tiny");
            assert_eq!(matches, ["hf:org/g:tiny.gguf", "hf:other/x:tiny.gguf"]);
        }
        r => panic!("{r:?}"),
    }

    let removed = store.remove("hf:other/x:tiny.gguf").unwrap();
    assert_eq!(removed.path, dir.0.join("hf/other/x/tiny.gguf"));
    assert!(
        !dir.0.join("hf/other").exists(),
        "emptied directories removed"
    );
    store.remove("hf:org/st").unwrap();
    store.remove("tiny").unwrap();
    assert!(!dir.0.join("hf").exists());
    assert!(matches!(
        store.remove("tiny"),
        Err(Error::NotInStore { name }) if name == "tiny"
    ));
    // The partial download of a removed model goes with it; others' files stay.
    store.remove("local").unwrap();
    assert_only(&dir, &[".hidden.gguf"]);
}
