//! `mica browse`: the catalog and the local store in one terminal UI — filter by category
//! (chat, code, base, installed), search, see sizes and what is installed, download with a
//! progress gauge, delete, and open a model in `mica chat`. Keys: `?` in the UI, or
//! [`ui::HELP`].
//!
//! Where standard input or output is not a terminal (a pipe, a script, CI) or with
//! `--plain`, it prints the same list as a table and exits.
//!
//! Built on `ratatui` (with its `crossterm` backend), the maintained terminal UI library
//! for Rust; downloads run on a thread through the store's [`Progress`] events, so the UI
//! keeps drawing while a model arrives.

mod app;
mod ui;

use std::io::IsTerminal;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use mica::hub::{Event, Phase, Progress, Store, human_bytes};
use ratatui::crossterm::event::{self, KeyCode, KeyEventKind, KeyModifiers};

use crate::store::{env, list::print_table};
use app::{Action, App, Download, Item, Key};

#[derive(Args, Debug)]
pub struct BrowseArgs {
    /// Print the list as a table instead of the interactive view (the default when not on
    /// a terminal).
    #[arg(long)]
    pub plain: bool,
}

pub fn browse_cmd(args: BrowseArgs) -> Result<()> {
    let store = env::store()?;
    let interactive =
        !args.plain && std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if !interactive {
        print_plain(&app::items(&store.list().map_err(env::explain)?));
        return Ok(());
    }
    match run_tui(&store)? {
        Some(name) => chat_with(&name),
        None => Ok(()),
    }
}

/// The plain listing: the same rows as the interactive table.
fn print_plain(items: &[Item]) {
    let rows: Vec<[String; 5]> = items
        .iter()
        .map(|i| {
            let size = human_bytes(i.size);
            [
                i.name.clone(),
                i.category.map_or("local", |c| c.as_str()).to_string(),
                if i.approx { format!("~{size}") } else { size },
                if i.installed { "installed" } else { "" }.to_string(),
                i.description.clone(),
            ]
        })
        .collect();
    print_table(&["NAME", "KIND", "SIZE", "STATE", "DESCRIPTION"], &rows);
}

/// What the download thread tells the UI.
enum Msg {
    Status(String),
    Start {
        phase: Phase,
        total: Option<u64>,
        done: u64,
    },
    Advance(u64),
    /// The pull ended: the model's name and the error, if any.
    Done(String, Option<String>),
}

fn start_download(store: &Store, name: String, tx: Sender<Msg>) {
    let store = store.clone();
    std::thread::spawn(move || {
        let events = tx.clone();
        let sink = move |e: Event<'_>| {
            let m = match e {
                Event::Status(s) => Msg::Status(s.to_string()),
                Event::Start { phase, total, done } => Msg::Start { phase, total, done },
                Event::Advance(n) => Msg::Advance(n),
                Event::Finish => return,
            };
            let _ = events.send(m);
        };
        let r = store.pull(&name, &env::hub(), Some(&sink as &dyn Progress));
        let err = r.err().map(|e| format!("{:#}", env::explain(e)));
        let _ = tx.send(Msg::Done(name, err));
    });
}

/// Applies what the download thread said; true when the store changed.
fn apply(app: &mut App, store: &Store, rx: &Receiver<Msg>) -> bool {
    let mut changed = false;
    while let Ok(m) = rx.try_recv() {
        match m {
            Msg::Done(name, err) => {
                app.download = None;
                match err {
                    None => app.message = format!("downloaded {name}"),
                    Some(e) => app.message = format!("download failed: {e}"),
                }
                refresh(app, store, Some(&name));
                changed = true;
            }
            m => {
                let Some(d) = app.download.as_mut() else {
                    continue;
                };
                match m {
                    Msg::Status(s) => d.status = s,
                    Msg::Start { phase, total, done } => {
                        d.phase = Some(phase);
                        d.total = total;
                        d.done = done;
                    }
                    Msg::Advance(n) => d.done += n,
                    Msg::Done(..) => unreachable!(),
                }
            }
        }
    }
    changed
}

fn refresh(app: &mut App, store: &Store, keep: Option<&str>) {
    match store.list() {
        Ok(inst) => app.set_items(app::items(&inst), keep),
        Err(e) => app.message = format!("cannot read the store: {e}"),
    }
}

fn key_of(k: event::KeyEvent) -> Option<Key> {
    let ctrl = k.modifiers.contains(KeyModifiers::CONTROL);
    Some(match k.code {
        KeyCode::Char('c') if ctrl => Key::CtrlC,
        KeyCode::Char(c) => Key::Char(c),
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::Left => Key::Left,
        KeyCode::Right => Key::Right,
        KeyCode::PageUp => Key::PageUp,
        KeyCode::PageDown => Key::PageDown,
        KeyCode::Home => Key::Home,
        KeyCode::End => Key::End,
        KeyCode::Tab => Key::Tab,
        KeyCode::BackTab => Key::BackTab,
        KeyCode::Enter => Key::Enter,
        KeyCode::Esc => Key::Esc,
        KeyCode::Backspace => Key::Backspace,
        KeyCode::Delete => Key::Delete,
        _ => return None,
    })
}

/// Runs the interactive view; returns the model to chat with, if one was chosen.
fn run_tui(store: &Store) -> Result<Option<String>> {
    let mut app = App::new(app::items(&store.list().map_err(env::explain)?));
    let (tx, rx) = channel();
    let mut terminal = ratatui::init();
    let result = (|| -> Result<Option<String>> {
        loop {
            apply(&mut app, store, &rx);
            terminal.draw(|f| ui::draw(f, &app)).context("drawing")?;
            if !event::poll(Duration::from_millis(100)).context("reading the terminal")? {
                continue;
            }
            let event::Event::Key(k) = event::read().context("reading the terminal")? else {
                continue;
            };
            if k.kind != KeyEventKind::Press {
                continue;
            }
            let Some(key) = key_of(k) else { continue };
            match app.on_key(key) {
                Action::None => {}
                Action::Quit => return Ok(None),
                Action::Chat(name) => return Ok(Some(name)),
                Action::Download(name) => {
                    app.message = format!("downloading {name}");
                    app.download = Some(Download {
                        name: name.clone(),
                        phase: None,
                        done: 0,
                        total: None,
                        status: String::new(),
                    });
                    start_download(store, name, tx.clone());
                }
                Action::Delete(name) => {
                    app.message = match store.remove(&name) {
                        Ok(m) => format!("deleted {} ({})", m.name, human_bytes(m.size)),
                        Err(e) => format!("cannot delete {name}: {e}"),
                    };
                    refresh(&mut app, store, Some(&name));
                }
            }
        }
    })();
    ratatui::restore();
    if let Some(d) = &app.download {
        eprintln!(
            "mica: the download of {} was interrupted; `mica pull {}` resumes it",
            d.name, d.name
        );
    }
    result
}

/// Hands the terminal to `mica chat -m NAME` and exits with its status.
fn chat_with(name: &str) -> Result<()> {
    let exe = std::env::current_exe().context("finding the mica binary")?;
    let status = std::process::Command::new(exe)
        .args(["chat", "-m", name])
        .status()
        .context("starting mica chat")?;
    std::process::exit(status.code().unwrap_or(1));
}
