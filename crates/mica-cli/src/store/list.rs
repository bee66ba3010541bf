//! What the store holds: finding installed models, describing them (`mica list`) and
//! removing them (`mica rm`).
//!
//! The store is a plain directory, `$MICA_HOME/models`, so a model is found by looking at
//! files rather than in an index that could drift from them:
//! - `models/<file>.gguf`: a catalog model (named by the catalog when the file name is one
//!   of its entries') or any GGUF put there (named by its file stem);
//! - `models/hf/<org>/<repo>/<file>.gguf`: pulled from the hub, named `hf:<org>/<repo>:<file>`;
//! - `models/hf/<org>/<repo>/` holding `*.safetensors`: a hub repository in safetensors form,
//!   named `hf:<org>/<repo>`.
//!
//! Hidden files (locks, `.part` downloads) are not models. `mica list` reads each GGUF's
//! header for the architecture and quantization, and a safetensors repository's
//! `config.json`.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use indicatif::HumanBytes;

use super::catalog;

/// How a model is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gguf,
    Safetensors,
}

/// A model in the store.
#[derive(Debug, Clone)]
pub struct Installed {
    /// The name `-m`, `mica rm` and `mica list` use.
    pub name: String,
    /// The `.gguf` file, or the directory of a safetensors repository.
    pub path: PathBuf,
    pub kind: Kind,
    /// Bytes on disk (all weight and config files of a directory).
    pub size: u64,
}

/// Every model in `models` (which need not exist), sorted by name.
pub fn installed(models: &Path) -> Result<Vec<Installed>> {
    let mut out = Vec::new();
    for (path, name) in files(models)? {
        if let Some(stem) = name.strip_suffix(".gguf") {
            let name =
                catalog::by_file_name(&name).map_or(stem.to_string(), |e| e.name.to_string());
            out.push(gguf(name, path));
        }
    }
    for (org_dir, org) in dirs(&models.join("hf"))? {
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

fn gguf(name: String, path: PathBuf) -> Installed {
    let size = fs::metadata(&path).map_or(0, |m| m.len());
    Installed {
        name,
        path,
        kind: Kind::Gguf,
        size,
    }
}

/// The installed model called `name`: by its exact name (case-insensitive), else the one
/// whose file name or file stem it is, else the one whose name ends with `:name` or
/// `/name` — when only one model matches.
pub fn find(models: &Path, name: &str) -> Result<Option<Installed>> {
    let all = installed(models)?;
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
        many => {
            let names: Vec<&str> = many.iter().map(|m| m.name.as_str()).collect();
            bail!("{name:?} matches several models: {}", names.join(", "))
        }
    }
}

/// `mica list`: one row per installed model.
pub fn print_installed(models: &Path) -> Result<()> {
    let all = installed(models)?;
    if all.is_empty() {
        println!(
            "no models in {}; `mica pull NAME` fetches one (`mica list --catalog` shows the names)",
            models.display()
        );
        return Ok(());
    }
    let rows: Vec<[String; 5]> = all
        .iter()
        .map(|m| {
            let (arch, quant) = describe(m);
            let kind = match m.kind {
                Kind::Gguf => "gguf",
                Kind::Safetensors => "safetensors",
            };
            [
                m.name.clone(),
                HumanBytes(m.size).to_string(),
                kind.to_string(),
                arch,
                quant,
            ]
        })
        .collect();
    print_table(&["NAME", "SIZE", "TYPE", "ARCH", "QUANT"], &rows);
    Ok(())
}

/// `mica list --catalog`: the names `mica pull` knows, marking the installed ones.
pub fn print_catalog(models: &Path) -> Result<()> {
    let all = installed(models).unwrap_or_default();
    let rows: Vec<[String; 5]> = catalog::CATALOG
        .iter()
        .map(|e| {
            let here = all.iter().any(|m| m.name == e.name);
            let size = HumanBytes(e.size).to_string();
            [
                format!("{}{}", e.name, if here { " *" } else { "" }),
                if e.sha256.is_some() {
                    size
                } else {
                    format!("~{size}")
                },
                e.license.to_string(),
                e.description.to_string(),
                String::new(),
            ]
        })
        .collect();
    print_table(&["NAME", "SIZE", "LICENSE", "DESCRIPTION", ""], &rows);
    println!("(* = in the store; also: mica pull hf:ORG/REPO[:FILE])");
    Ok(())
}

/// `mica rm NAME`: deletes the model's file (or directory) and any partial download of it.
pub fn remove(models: &Path, name: &str) -> Result<()> {
    let Some(m) = find(models, name)? else {
        bail!("no model called {name:?} in the store; `mica list` shows what is there");
    };
    match m.kind {
        Kind::Gguf => fs::remove_file(&m.path),
        Kind::Safetensors => fs::remove_dir_all(&m.path),
    }
    .with_context(|| format!("cannot remove {}", m.path.display()))?;
    // Its partial download and the lock file pulls of it take.
    if let (Some(dir), Some(file)) = (m.path.parent(), m.path.file_name()) {
        let file = file.to_string_lossy();
        fs::remove_file(dir.join(format!("{file}.part"))).ok();
        fs::remove_file(dir.join(format!(".{file}.lock"))).ok();
    }
    // Drop emptied hf/<org>/<repo> and hf/<org> directories (remove_dir fails on non-empty).
    if m.name.starts_with("hf:") {
        let mut dir = m.path.parent();
        while let Some(d) = dir {
            if d == models || fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
    }
    println!(
        "removed {} ({}, {})",
        m.name,
        HumanBytes(m.size),
        m.path.display()
    );
    Ok(())
}

/// (architecture, quantization) of a model, or placeholders when they cannot be read.
fn describe(m: &Installed) -> (String, String) {
    match m.kind {
        Kind::Gguf => match mica_formats::GgufFile::open(&m.path) {
            Ok(g) => (
                g.get_str("general.architecture").unwrap_or("?").to_string(),
                g.get_u32("general.file_type")
                    .map_or_else(|| "?".to_string(), crate::bench::ftype_name),
            ),
            Err(_) => ("(unreadable)".into(), "-".into()),
        },
        Kind::Safetensors => {
            let config = fs::read_to_string(m.path.join("config.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
            let get = |k: &str| {
                config
                    .as_ref()
                    .and_then(|c| c.get(k))
                    .map(|v| match v {
                        serde_json::Value::Array(a) => a.first().cloned().unwrap_or_default(),
                        v => v.clone(),
                    })
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_else(|| "?".into())
            };
            let dtype = get("torch_dtype");
            (get("architectures"), dtype)
        }
    }
}

fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == N || cells[i + 1..].iter().all(|c| c.is_empty()) {
                s.push_str(cell);
                break;
            }
            s.push_str(&format!("{cell:<w$}  "));
        }
        println!("{}", s.trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
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
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
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
