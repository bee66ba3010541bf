//! `mica pull`, `mica list`, `mica rm`, and turning what a user passes to `-m` (a store name
//! or a path) into a model file. The store itself is the `mica-hub` library; this module
//! parses the commands, draws its progress and prints its results.
//!
//! The store lives in `$MICA_HOME/models` ([`env`]), the same directory `mica run` keeps
//! its default model in, so that model shows up as `smollm2-135m-instruct`.

pub mod env;
pub(crate) mod list;

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;
use indicatif::{HumanBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};
use mica::hub::{Event, Progress, Store};

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
    let term = Terminal::default();
    let path = env::store()?
        .pull(&args.name, &env::hub(), term.unless(args.quiet))
        .map_err(env::explain)?;
    println!("{}", path.display());
    Ok(())
}

pub fn list_cmd(args: ListArgs) -> Result<()> {
    let store = env::store()?;
    if args.catalog {
        list::print_catalog(&store);
        Ok(())
    } else {
        list::print_installed(&store)
    }
}

pub fn rm_cmd(args: RmArgs) -> Result<()> {
    let store = env::store()?;
    for name in &args.names {
        let m = store.remove(name).map_err(env::explain)?;
        println!(
            "removed {} ({}, {})",
            m.name,
            HumanBytes(m.size),
            m.path.display()
        );
    }
    Ok(())
}

/// The model file for `-m`: without it, the default model (fetched on first use); with it,
/// an existing path, else a model in the store, else a catalog or hub name, pulled first.
pub fn resolve_model(arg: Option<&str>, quiet: bool) -> Result<PathBuf> {
    match arg {
        None => default_model(quiet),
        Some(s) => resolve_in(s, &env::models_dir()?, quiet),
    }
}

/// [`resolve_model`] for a given name or path, with the store at `models`.
pub fn resolve_in(arg: &str, models: &Path, quiet: bool) -> Result<PathBuf> {
    let term = Terminal::default();
    Store::open(models)
        .resolve(arg, &env::hub(), term.unless(quiet))
        .map_err(env::explain)
}

/// The default model, fetched into the store on first use.
pub fn default_model(quiet: bool) -> Result<PathBuf> {
    let term = Terminal::default();
    let (store, source, hub) = (env::store()?, env::default_source(), env::hub());
    env::default_model(&store, &source, &hub, term.unless(quiet))
}

/// Store progress on stderr: status lines as `mica: …`, each transfer as a byte-count bar
/// (drawn only when stderr is a terminal).
#[derive(Default)]
struct Terminal {
    bar: RefCell<Option<ProgressBar>>,
}

impl Terminal {
    /// Itself as a progress sink, or none when `quiet`.
    fn unless(&self, quiet: bool) -> Option<&dyn Progress> {
        (!quiet).then_some(self as &dyn Progress)
    }
}

impl Progress for Terminal {
    fn event(&self, event: Event<'_>) {
        match event {
            Event::Status(line) => eprintln!("mica: {line}"),
            Event::Start { phase, total, done } => {
                let (bar, template) = match total {
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
                bar.set_message(phase.as_str());
                bar.set_position(done);
                *self.bar.borrow_mut() = Some(bar);
            }
            Event::Advance(n) => {
                if let Some(bar) = &*self.bar.borrow() {
                    bar.inc(n);
                }
            }
            Event::Finish => {
                if let Some(bar) = self.bar.borrow_mut().take() {
                    bar.finish_and_clear();
                }
            }
        }
    }
}
