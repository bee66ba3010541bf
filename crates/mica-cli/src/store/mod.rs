//! The local model store: `mica pull`, `mica list`, `mica rm`, and turning what a user
//! passes to `-m` (a store name or a path) into a model file.
//!
//! The store lives in `$MICA_HOME/models` (default: the user cache directory, see
//! [`crate::download::models_dir`]), the same directory `mica run` keeps its default model
//! in, so that model shows up as `smollm2-135m-instruct`. [`catalog`] is the built-in list
//! of names, [`pull`] fetches, [`list`] finds and describes what is there.

pub mod catalog;
pub mod list;
pub mod pull;

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use clap::Args;

use crate::download;

#[derive(Args, Debug)]
pub struct PullArgs {
    /// A catalog name (see `mica list --catalog`) or hf:ORG/REPO[:FILE].
    pub name: String,
    /// No progress or status messages.
    #[arg(short, long)]
    pub quiet: bool,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Show the catalog of models `mica pull` knows instead.
    #[arg(long)]
    pub catalog: bool,
}

#[derive(Args, Debug)]
pub struct RmArgs {
    /// Store name(s) as `mica list` shows them.
    #[arg(required = true)]
    pub names: Vec<String>,
}

pub fn pull_cmd(args: PullArgs) -> Result<()> {
    let path = pull::pull(
        &args.name,
        &download::models_dir()?,
        &pull::Hub::from_env(),
        args.quiet,
    )?;
    println!("{}", path.display());
    Ok(())
}

pub fn list_cmd(args: ListArgs) -> Result<()> {
    let models = download::models_dir()?;
    if args.catalog {
        list::print_catalog(&models)
    } else {
        list::print_installed(&models)
    }
}

pub fn rm_cmd(args: RmArgs) -> Result<()> {
    let models = download::models_dir()?;
    for name in &args.names {
        list::remove(&models, name)?;
    }
    Ok(())
}

/// The model file for `-m`: without it, the default model (fetched on first use); with it,
/// an existing path, else a model in the store, else a catalog or hub name, pulled first.
pub fn resolve_model(arg: Option<&str>, quiet: bool) -> Result<PathBuf> {
    match arg {
        None => download::ensure_model(&download::DEFAULT_MODEL, quiet),
        Some(s) => resolve_in(s, &download::models_dir()?, quiet),
    }
}

/// [`resolve_model`] for a given name or path, with the store at `models`.
pub fn resolve_in(arg: &str, models: &Path, quiet: bool) -> Result<PathBuf> {
    let path = Path::new(arg);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    if arg.trim().is_empty() {
        bail!("the model name is empty");
    }
    if let Some(m) = list::find(models, arg)? {
        // A safetensors repository is a Hugging Face folder, which the loader reads too.
        return Ok(m.path);
    }
    if catalog::find(arg).is_some() || arg.starts_with("hf:") {
        if !quiet {
            eprintln!("mica: {arg} is not in the store yet; pulling it");
        }
        return pull::pull(arg, models, &pull::Hub::from_env(), quiet);
    }
    bail!(
        "{arg}: no such file, and no model of that name in the store (`mica list` shows the store, `mica list --catalog` what `mica pull` can fetch)"
    )
}
