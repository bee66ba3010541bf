//! The store: a plain directory of models, what it holds, and turning what a user passes
//! as a model (a path or a name) into a model path.
//!
//! A model is found by looking at files rather than in an index that could drift from
//! them:
//! - `<store>/<file>.gguf`: a catalog model (named by the catalog when the file name is one
//!   of its entries') or any GGUF put there (named by its file stem);
//! - `<store>/hf/<org>/<repo>/<file>.gguf`: pulled from the hub, named
//!   `hf:<org>/<repo>:<file>`;
//! - `<store>/hf/<org>/<repo>/` holding `*.safetensors`: a hub repository in safetensors
//!   form, named `hf:<org>/<repo>`.
//!
//! Hidden files (locks, temporary downloads) and `.part` files are not models.

use std::fs;
use std::path::{Path, PathBuf};

use crate::catalog;
use crate::error::{Error, Result};
use crate::hub::Hub;
use crate::progress::{Progress, Sink};

/// A model store rooted at one directory (which need not exist until something is pulled).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Store {
    dir: PathBuf,
}

/// How a model is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gguf,
    Safetensors,
}

/// A model in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The name [`Store::find`], [`Store::remove`] and [`Store::resolve`] take.
    pub name: String,
    /// The `.gguf` file, or the directory of a safetensors repository.
    pub path: PathBuf,
    pub kind: Kind,
    /// Bytes on disk (all weight and config files of a directory).
    pub size: u64,
}

impl Store {
    /// The store in `dir` (for `mica`, `$MICA_HOME/models`). Nothing is read or created
    /// until it is used.
    pub fn open(dir: impl Into<PathBuf>) -> Store {
        Store { dir: dir.into() }
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every model in the store, sorted by name.
    pub fn list(&self) -> Result<Vec<Installed>> {
        let mut out = Vec::new();
        for (path, name) in files(&self.dir)? {
            if let Some(stem) = name.strip_suffix(".gguf") {
                let name =
                    catalog::by_file_name(&name).map_or(stem.to_string(), |e| e.name.to_string());
                out.push(gguf(name, path));
            }
        }
        for (org_dir, org) in dirs(&self.dir.join("hf"))? {
            for (repo_dir, repo) in dirs(&org_dir)? {
                let mut weights = 0;
                let mut has_weights = false;
                for (path, name) in walk(&repo_dir)? {
                    if name.ends_with(".gguf") {
                        let rel = path.strip_prefix(&repo_dir).unwrap_or(&path);
                        let rel = rel.to_string_lossy().replace('\\', "/");
                        out.push(gguf(format!("hf:{org}/{repo}:{rel}"), path));
                    } else {
                        has_weights |= name.ends_with(".safetensors");
                        weights += fs::metadata(&path).map_or(0, |m| m.len());
                    }
                }
                if has_weights {
                    out.push(Installed {
                        name: format!("hf:{org}/{repo}"),
                        path: repo_dir.clone(),
                        kind: Kind::Safetensors,
                        size: weights,
                    });
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The installed model called `name`: by its exact name (case-insensitive), else the
    /// one whose file name or file stem it is, else the one whose name ends with `:name` or
    /// `/name` — when only one model matches ([`Error::Ambiguous`] otherwise).
    pub fn find(&self, name: &str) -> Result<Option<Installed>> {
        let all = self.list()?;
        if let Some(m) = all.iter().find(|m| m.name.eq_ignore_ascii_case(name)) {
            return Ok(Some(m.clone()));
        }
        let matches: Vec<&Installed> = all
            .iter()
            .filter(|m| {
                let file = m.path.file_name().and_then(|f| f.to_str()).unwrap_or("");
                file == name
                    || file.strip_suffix(".gguf") == Some(name)
                    || m.name.ends_with(&format!(":{name}"))
                    || m.name.ends_with(&format!("/{name}"))
            })
            .collect();
        match matches.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some((*one).clone())),
            many => Err(Error::Ambiguous {
                name: name.into(),
                matches: many.iter().map(|m| m.name.clone()).collect(),
            }),
        }
    }

    /// Deletes the model called `name` (its file or directory) and any partial download and
    /// lock file of it, then the `hf/<org>/<repo>` directories that emptied; returns what
    /// was removed.
    pub fn remove(&self, name: &str) -> Result<Installed> {
        let Some(m) = self.find(name)? else {
            return Err(Error::NotInStore { name: name.into() });
        };
        match m.kind {
            Kind::Gguf => fs::remove_file(&m.path),
            Kind::Safetensors => fs::remove_dir_all(&m.path),
        }
        .map_err(Error::io("remove", &m.path))?;
        if let (Some(dir), Some(file)) = (m.path.parent(), m.path.file_name()) {
            let file = file.to_string_lossy();
            fs::remove_file(dir.join(format!("{file}.part"))).ok();
            fs::remove_file(dir.join(format!(".{file}.lock"))).ok();
        }
        // `remove_dir` fails on a directory that is not empty, which ends the climb.
        if m.name.starts_with("hf:") {
            let mut dir = m.path.parent();
            while let Some(d) = dir {
                if d == self.dir || fs::remove_dir(d).is_err() {
                    break;
                }
                dir = d.parent();
            }
        }
        Ok(m)
    }

    /// The model path for `arg`: an existing path as it is, else a model in the store
    /// (a safetensors repository resolves to its folder, which the loader reads as a
    /// Hugging Face folder), else a catalog or `hf:` name, pulled first.
    pub fn resolve(
        &self,
        arg: &str,
        hub: &Hub,
        progress: Option<&dyn Progress>,
    ) -> Result<PathBuf> {
        let path = Path::new(arg);
        if path.exists() {
            return Ok(path.to_path_buf());
        }
        if arg.trim().is_empty() {
            return Err(Error::EmptyName);
        }
        if let Some(m) = self.find(arg)? {
            return Ok(m.path);
        }
        if catalog::find(arg).is_some() || arg.starts_with("hf:") {
            Sink(progress).status(&format!("{arg} is not in the store yet; pulling it"));
            return self.pull(arg, hub, progress);
        }
        Err(Error::NotFound { arg: arg.into() })
    }
}

fn gguf(name: String, path: PathBuf) -> Installed {
    let size = fs::metadata(&path).map_or(0, |m| m.len());
    Installed {
        name,
        path,
        kind: Kind::Gguf,
        size,
    }
}

/// Visible regular files directly in `dir` (none when it does not exist).
fn files(dir: &Path) -> Result<Vec<(PathBuf, String)>> {
    entries(dir, false)
}

/// Visible directories directly in `dir`.
fn dirs(dir: &Path) -> Result<Vec<(PathBuf, String)>> {
    entries(dir, true)
}

/// Visible regular files under `dir`, recursively.
fn walk(dir: &Path) -> Result<Vec<(PathBuf, String)>> {
    let mut out = files(dir)?;
    for (sub, _) in dirs(dir)? {
        out.extend(walk(&sub)?);
    }
    Ok(out)
}

fn entries(dir: &Path, want_dirs: bool) -> Result<Vec<(PathBuf, String)>> {
    let read = match fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("read", dir)(e)),
    };
    let mut out = Vec::new();
    for entry in read.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name.ends_with(".part") {
            continue;
        }
        // Follows symbolic links, so a linked model counts.
        let is_dir = entry.path().is_dir();
        if is_dir == want_dirs && (is_dir || entry.path().is_file()) {
            out.push((entry.path(), name));
        }
    }
    out.sort();
    Ok(out)
}
