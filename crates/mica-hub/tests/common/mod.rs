//! Shared helpers of the mica-hub tests: the fake hub server (`server.rs`, also used by the
//! mica-cli tests), scratch directories, a progress recorder.
#![allow(dead_code)]

mod server;

pub use server::*;

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use mica_hub::{Event, Phase};

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
