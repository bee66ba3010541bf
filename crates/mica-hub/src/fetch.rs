//! Moving bytes onto disk safely: the two download strategies and the file-system
//! discipline they share.
//!
//! - [`fetch_resumable`] (pulls into the store) writes `<dest>.part`, keeps it when the
//!   transfer is interrupted, and next time asks only for the rest with an HTTP `Range`
//!   request, hashing the bytes already there before appending.
//! - [`download_once`] (the default model and its wheel) writes a hidden temporary file that
//!   is removed on any error.
//!
//! Either way the file's size and sha256 (when known) are checked before it is renamed into
//! place ([`TempFile::persist`]), so nothing ever appears under a final name that did not
//! verify, and a lock file ([`lock_dir`]) serialises two processes fetching the same file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::hub::Hub;
use crate::progress::{Phase, Sink, human_bytes};

/// Downloads `url` to `dest` through `<dest>.part`, resuming a previous partial download
/// with a `Range` request, then checks `size` and `sha256` (when given) and renames the
/// file into place. `token` is sent as a bearer token (hub URLs only). An interrupted
/// transfer keeps the `.part` for the next attempt; a verification failure deletes it.
pub(crate) fn fetch_resumable(
    hub: &Hub,
    url: &str,
    token: Option<&str>,
    dest: &Path,
    sha256: Option<&str>,
    size: Option<u64>,
    sink: Sink,
) -> Result<()> {
    let part = with_suffix(dest, ".part");
    let mut have = fs::metadata(&part).map_or(0, |m| m.len());
    if size.is_some_and(|s| have > s) {
        fs::remove_file(&part).ok();
        have = 0;
    }
    let mut req = hub.agent().get(url);
    if let Some(token) = token {
        req = req.header("Authorization", format!("Bearer {token}"));
    }
    if have > 0 {
        req = req.header("Range", format!("bytes={have}-"));
    }
    let mut resp = req.call().map_err(|e| Error::Request {
        url: url.to_string(),
        error: Box::new(e),
    })?;
    let status = resp.status().as_u16();
    let total = match status {
        200 => {
            have = 0;
            resp.body().content_length().or(size)
        }
        206 => {
            let range = resp
                .headers()
                .get("content-range")
                .and_then(|v| v.to_str().ok())
                .and_then(parse_content_range);
            match range {
                Some((start, total)) if start == have => total.or(size),
                _ => {
                    return Err(Error::BadContentRange {
                        url: url.to_string(),
                        part,
                    });
                }
            }
        }
        // Nothing left to send: the part is already whole (or the server's file shrank,
        // which verification then catches).
        416 if have > 0 => Some(have),
        404 => return Err(Error::FileNotFound { url: url.into() }),
        401 | 403 => {
            return Err(Error::Refused {
                what: url.into(),
                status,
            });
        }
        _ => {
            return Err(Error::Status {
                url: url.into(),
                status,
                reason: resp.status().canonical_reason().unwrap_or("").into(),
            });
        }
    };
    if let (Some(total), Some(size)) = (total, size)
        && total != size
    {
        return Err(Error::LengthMismatch {
            url: url.into(),
            announced: total,
            expected: size,
        });
    }
    if have > 0 {
        sink.status(&format!(
            "resuming {} at {}",
            file_label(dest),
            human_bytes(have)
        ));
    }
    // Hash what is already there, then append the rest.
    let mut hasher = Sha256::new();
    if have > 0 {
        let f = File::open(&part).map_err(Error::io("open", &part))?;
        hash_into(f.take(have), &mut hasher).map_err(Error::io("read", &part))?;
    }
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(have == 0)
        .open(&part)
        .map_err(Error::io("write", &part))?;
    file.set_len(have)
        .and_then(|_| file.seek(io::SeekFrom::End(0)).map(|_| ()))
        .map_err(Error::io("write", &part))?;
    sink.start(Phase::Pulling, total, have);
    let mut writer = io::BufWriter::with_capacity(1 << 20, file);
    let copied = if status == 416 {
        Ok(0)
    } else {
        copy_hashing(resp.body_mut().as_reader(), &mut writer, &mut hasher, sink)
    };
    sink.finish();
    let flushed = writer.into_inner().map_err(|e| e.into_error());
    let got = have + copied.as_ref().map_or_else(|e| e.copied, |n| *n);
    let interrupted = |reason: String| Error::Interrupted {
        url: url.into(),
        got,
        total,
        reason,
    };
    if let Err(e) = copied {
        return Err(interrupted(e.error.to_string()));
    }
    let file = flushed.map_err(Error::io("write", &part))?;
    if let Some(total) = total
        && got < total
    {
        return Err(interrupted("the connection closed early".into()));
    }
    let digest = hex(&hasher.finalize());
    let bad = match (total, sha256) {
        (Some(total), _) if got != total => Some(Error::RejectedSize {
            url: url.into(),
            got,
            expected: total,
        }),
        (_, Some(want)) if !digest.eq_ignore_ascii_case(want.trim()) => {
            Some(Error::RejectedSha256 {
                url: url.into(),
                got: digest,
                expected: want.trim().into(),
            })
        }
        _ => None,
    };
    if let Some(e) = bad {
        drop(file);
        fs::remove_file(&part).ok();
        return Err(e);
    }
    file.sync_all().map_err(Error::io("sync", &part))?;
    drop(file);
    TempFile::new(part).persist(dest)
}

/// Streams `url` into `path` (created or truncated); returns the sha256 of the bytes
/// received. Fails on a non-200 status and on a body shorter or longer than announced
/// (`Content-Length`, else `expected_size`). The caller owns (and removes) `path`.
pub(crate) fn download_once(
    hub: &Hub,
    url: &str,
    path: &Path,
    expected_size: Option<u64>,
    sink: Sink,
) -> Result<[u8; 32]> {
    let mut response = hub.agent().get(url).call().map_err(|e| Error::Request {
        url: url.into(),
        error: Box::new(e),
    })?;
    let status = response.status();
    if status != 200 {
        return Err(Error::Status {
            url: url.into(),
            status: status.as_u16(),
            reason: status.canonical_reason().unwrap_or("").into(),
        });
    }
    let total = response.body().content_length().or(expected_size);
    let file = File::create(path).map_err(Error::io("create", path))?;
    sink.start(Phase::Downloading, total, 0);
    let started = Instant::now();
    let mut writer = io::BufWriter::with_capacity(1 << 20, file);
    let mut hasher = Sha256::new();
    let copied = copy_hashing(
        response.body_mut().as_reader(),
        &mut writer,
        &mut hasher,
        sink,
    );
    sink.finish();
    let got = copied.map_err(|e| Error::Failed {
        url: url.into(),
        got: e.copied,
        total,
        error: e.error,
    })?;
    if let Some(total) = total
        && got != total
    {
        return Err(Error::Short {
            url: url.into(),
            got,
            total,
        });
    }
    let file = writer
        .into_inner()
        .map_err(|e| Error::io("write", path)(e.into_error()))?;
    file.sync_all().map_err(Error::io("sync", path))?;
    let secs = started.elapsed().as_secs_f64().max(1e-3);
    sink.status(&format!(
        "downloaded {} in {secs:.1} s ({}/s)",
        human_bytes(got),
        human_bytes((got as f64 / secs) as u64)
    ));
    Ok(hasher.finalize().into())
}

/// Bytes copied before a read or write failed, and the failure.
pub(crate) struct CopyError {
    pub(crate) copied: u64,
    pub(crate) error: io::Error,
}

/// Copies `reader` to `writer`, feeding every byte to `hasher` and reporting each chunk to
/// `sink`; returns the bytes copied. On a read error what arrived is flushed first, so a
/// resumable download keeps it.
pub(crate) fn copy_hashing(
    mut reader: impl Read,
    mut writer: impl Write,
    hasher: &mut Sha256,
    sink: Sink,
) -> std::result::Result<u64, CopyError> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut copied = 0;
    let fail = |copied, error| CopyError { copied, error };
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                writer.flush().ok();
                return Err(fail(copied, e));
            }
        };
        hasher.update(&buf[..n]);
        writer.write_all(&buf[..n]).map_err(|e| fail(copied, e))?;
        copied += n as u64;
        sink.advance(n as u64);
    }
    writer.flush().map_err(|e| fail(copied, e))?;
    Ok(copied)
}

/// Feeds everything `reader` yields to `hasher`.
pub(crate) fn hash_into(mut reader: impl Read, hasher: &mut Sha256) -> io::Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Checks a digest against an expected sha256 (hex, either case); `what` names the
/// file in the error.
pub(crate) fn check_sha256(digest: &[u8; 32], expected: &str, what: &str) -> Result<()> {
    let got = hex(digest);
    if !got.eq_ignore_ascii_case(expected.trim()) {
        return Err(Error::Sha256Mismatch {
            what: what.into(),
            got,
            expected: expected.trim().into(),
        });
    }
    Ok(())
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses `bytes START-END/TOTAL` (TOTAL may be `*`) into (START, TOTAL).
fn parse_content_range(v: &str) -> Option<(u64, Option<u64>)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (start, _) = range.split_once('-')?;
    Some((start.trim().parse().ok()?, total.trim().parse().ok()))
}

/// Takes an exclusive lock on `dir/.<file_name>.lock`, waiting (with a status line) while
/// another process holds it. Filesystems without locking support are used unlocked. The
/// lock is held until the returned file is dropped.
pub(crate) fn lock_dir(dir: &Path, file_name: &str, sink: Sink) -> Result<Option<File>> {
    let path = dir.join(format!(".{file_name}.lock"));
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(Error::io("create lock file", &path))?;
    match file.try_lock() {
        Ok(()) => return Ok(Some(file)),
        Err(fs::TryLockError::WouldBlock) => {}
        Err(fs::TryLockError::Error(e)) if e.kind() == io::ErrorKind::Unsupported => {
            return Ok(None);
        }
        Err(fs::TryLockError::Error(e)) => return Err(Error::io("lock", &path)(e)),
    }
    sink.status(&format!(
        "waiting for another mica process that is downloading {file_name}"
    ));
    file.lock().map_err(Error::io("lock", &path))?;
    Ok(Some(file))
}

/// `dir/.<dest file name><suffix>`: hidden, next to `dest` so the final rename stays on one
/// filesystem.
pub(crate) fn partial_path(dest: &Path, suffix: &str) -> Result<PathBuf> {
    let name = dest
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::BadPath { path: dest.into() })?;
    Ok(dest.with_file_name(format!(".{name}{suffix}")))
}

/// `dest` with `suffix` appended to its file name.
pub(crate) fn with_suffix(dest: &Path, suffix: &str) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    dest.with_file_name(name)
}

fn file_label(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// `url` without its `#fragment` (pip appends `#sha256=…`).
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
        fs::rename(&self.path, dest).map_err(|source| Error::Rename {
            from: self.path.clone(),
            to: dest.into(),
            source,
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
    fn parses_content_ranges() {
        assert_eq!(
            parse_content_range("bytes 100-199/200"),
            Some((100, Some(200)))
        );
        assert_eq!(parse_content_range("bytes 5-9/*"), Some((5, None)));
        assert_eq!(parse_content_range("items 1-2/3"), None);
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

    #[test]
    fn copy_reports_what_arrived_before_a_failure() {
        struct Flaky(usize);
        impl Read for Flaky {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.0 == 0 {
                    return Err(io::Error::other("cut"));
                }
                let n = self.0.min(buf.len()).min(7);
                buf[..n].fill(1);
                self.0 -= n;
                Ok(n)
            }
        }
        let mut out = Vec::new();
        let e = copy_hashing(Flaky(20), &mut out, &mut Sha256::new(), Sink(None)).unwrap_err();
        assert_eq!((e.copied, out.len()), (20, 20));
        assert_eq!(e.error.to_string(), "cut");
    }
}
