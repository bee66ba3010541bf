//! `mica browse` driven in a real terminal (tmux): navigate, filter by category, search,
//! download a catalog model from a local hub server with the progress gauge on screen,
//! delete it, the help pop-up; and the plain listing when not on a terminal.
//!
//! Needs `tmux` (Debian's `tmux` package; `scripts/test` installs it when missing): the
//! test fails, naming it, where it is absent.

mod common;

use common::hub::{Route, Server};
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The catalog entry served by the test hub (a hub source, not pinned by sha256).
const REPO: &str = "Qwen/Qwen3-0.6B-GGUF";
const FILE: &str = "Qwen3-0.6B-Q8_0.gguf";

struct Tmux {
    session: String,
}

impl Tmux {
    fn start(name: &str, home: &Path, hub: &str) -> Tmux {
        let have = Command::new("tmux").arg("-V").output();
        assert!(
            have.is_ok_and(|o| o.status.success()),
            "tmux is needed to test `mica browse` in a terminal: install it (Debian: apt-get install tmux)"
        );
        let session = format!("mica-browse-{}-{name}", std::process::id());
        let cmd = format!(
            "env MICA_HOME='{}' MICA_HF_ENDPOINT='{hub}' '{}' browse; sleep 30",
            home.display(),
            env!("CARGO_BIN_EXE_mica")
        );
        let ok = Command::new("tmux")
            .args([
                "new-session",
                "-d",
                "-s",
                &session,
                "-x",
                "140",
                "-y",
                "40",
                &cmd,
            ])
            .env_remove("TMUX")
            .status()
            .expect("running tmux");
        assert!(ok.success(), "tmux new-session failed");
        Tmux { session }
    }

    fn keys(&self, keys: &[&str]) {
        for k in keys {
            let ok = Command::new("tmux")
                .args(["send-keys", "-t", &self.session, k])
                .status()
                .unwrap();
            assert!(ok.success());
            std::thread::sleep(Duration::from_millis(150));
        }
    }

    fn screen(&self) -> String {
        let out = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &self.session])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until the screen satisfies `pred` (panics with the screen after `secs`).
    fn wait(&self, what: &str, secs: u64, pred: impl Fn(&str) -> bool) -> String {
        let t = Instant::now();
        loop {
            let s = self.screen();
            if pred(&s) {
                return s;
            }
            assert!(
                t.elapsed() < Duration::from_secs(secs),
                "timed out waiting for {what}; the screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.session])
            .status();
    }
}

/// The table's rows: the lines between its header and the bottom of its border.
fn rows(screen: &str) -> Vec<String> {
    screen
        .lines()
        .skip_while(|l| !(l.contains("NAME") && l.contains("KIND")))
        .skip(1)
        .take_while(|l| !l.starts_with('└'))
        .map(|l| {
            l.trim_matches(|c| c == '│' || c == ' ' || c == '>')
                .to_string()
        })
        .filter(|l| !l.is_empty() && !l.starts_with("no models match"))
        .collect()
}

#[test]
fn browse_filters_searches_downloads_and_deletes() {
    let server = Server::start();
    let home = scratch("browse");
    // A model file large enough that the download takes a second or two, sent slowly.
    let mut bytes = std::fs::read({
        let p = home.join("src.gguf");
        write_tiny(&p, &Tiny::default());
        p
    })
    .unwrap();
    bytes.resize(bytes.len().max(1 << 20), 0);
    server.repo(
        REPO,
        &[(FILE, Route::Slow(bytes.clone(), 64 << 10, 120))],
        None,
    );
    let t = Tmux::start("main", &home, &server.base);
    let s = t.wait("the list", 20, |s| s.contains("smollm2-135m-instruct"));
    assert!(
        s.contains("all") && s.contains("installed") && s.contains("? help"),
        "{s}"
    );

    // Category tabs: chat, then code (only coder models), then base.
    t.keys(&["Tab", "Tab"]);
    let s = t.wait("the code tab", 10, |s| {
        s.contains("coder") && !s.contains("smollm2-135m")
    });
    let code = rows(&s);
    assert!(!code.is_empty(), "{s}");
    assert!(code.iter().all(|r| r.contains("code")), "{s}");
    t.keys(&["Tab"]);
    let s = t.wait("the base tab", 10, |s| {
        s.contains("gemma3-270m") && !s.contains("coder")
    });
    assert!(rows(&s).iter().all(|r| r.contains("base")), "{s}");
    // Back to all, then search.
    t.keys(&["Tab", "Tab"]);
    t.wait("all models", 10, |s| {
        s.contains("smollm2-135m-instruct") && s.contains("coder")
    });
    t.keys(&["/", "q", "w", "e", "n", "3", "-", "0", "Enter"]);
    let s = t.wait("the search", 10, |s| s.contains("search: qwen3-0"));
    let found = rows(&s);
    assert_eq!(found.len(), 1, "{s}");
    assert!(found[0].contains("qwen3-0.6b"), "{s}");

    // Download it: the gauge shows progress, then the row is installed.
    t.keys(&["d"]);
    let s = t.wait("the progress gauge", 20, |s| {
        s.contains("pulling qwen3-0.6b") && s.contains('%')
    });
    assert!(s.contains("downloading"), "{s}");
    let s = t.wait("the download to finish", 60, |s| {
        s.contains("downloaded qwen3-0.6b")
    });
    assert!(rows(&s)[0].contains("installed"), "{s}");
    let stored = home.join("models").join(FILE);
    assert_eq!(std::fs::read(&stored).unwrap(), bytes, "the stored file");

    // The installed tab lists it.
    t.keys(&["Escape"]);
    for _ in 0..4 {
        t.keys(&["Tab"]);
    }
    let s = t.wait("the installed tab", 10, |s| {
        s.contains("qwen3-0.6b") && !s.contains("coder")
    });
    assert_eq!(rows(&s).len(), 1, "{s}");

    // Delete: asks first; n keeps it, y deletes it.
    t.keys(&["x"]);
    t.wait("the confirmation", 10, |s| {
        s.contains("delete qwen3-0.6b? y / n")
    });
    t.keys(&["n"]);
    t.wait("kept", 10, |s| s.contains("kept qwen3-0.6b"));
    assert!(stored.exists());
    t.keys(&["x", "y"]);
    let s = t.wait("the deletion", 10, |s| s.contains("deleted qwen3-0.6b"));
    assert!(rows(&s).is_empty(), "{s}");
    assert!(!stored.exists(), "the file is gone");

    // Help, then quit: the program ends (the pane's `sleep` runs after it).
    t.keys(&["?"]);
    t.wait("the help", 10, |s| {
        s.contains("keys (any key closes)") && s.contains("download the selected model")
    });
    t.keys(&["Escape", "q"]);
    t.wait("mica to exit", 10, |s| !s.contains("mica models"));
}

#[test]
fn browse_prints_a_plain_list_when_not_on_a_terminal() {
    let home = scratch("browse-plain");
    let out = Command::new(env!("CARGO_BIN_EXE_mica"))
        .arg("browse")
        .env("MICA_HOME", &home)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    for col in ["NAME", "KIND", "SIZE", "STATE", "DESCRIPTION"] {
        assert!(header.contains(col), "{header}");
    }
    let body: Vec<&str> = lines.collect();
    assert!(
        body.iter()
            .any(|l| l.starts_with("smollm2-135m-instruct") && l.contains("chat"))
    );
    assert!(
        body.iter()
            .any(|l| l.starts_with("qwen2.5-coder-0.5b-instruct") && l.contains("code"))
    );
    assert!(
        body.iter()
            .any(|l| l.starts_with("gemma3-270m ") && l.contains("base"))
    );
    assert!(!body.iter().any(|l| l.contains("installed")), "{text}");
}
