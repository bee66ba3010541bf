//! The state of `mica browse` and what each key does to it, apart from any terminal (the
//! unit tests below drive it directly).

use mica::hub::catalog::{self, Category};
use mica::hub::{Installed, Phase};

/// One model on the list: a catalog entry, installed or not, or a model in the store that
/// the catalog does not know.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub name: String,
    /// `None` for a store model the catalog does not describe.
    pub category: Option<Category>,
    /// Bytes: on disk when installed, else the catalog's (approximate unless pinned).
    pub size: u64,
    /// The catalog's size is only approximate (the hub gives the exact one at pull time).
    pub approx: bool,
    pub installed: bool,
    pub description: String,
    pub license: String,
}

/// The catalog and the store's models, merged: catalog order first, then the store's own.
pub fn items(installed: &[Installed]) -> Vec<Item> {
    let mut out: Vec<Item> = catalog::CATALOG
        .iter()
        .map(|e| {
            let here = installed.iter().find(|m| m.name == e.name);
            Item {
                name: e.name.to_string(),
                category: Some(e.category),
                size: here.map_or(e.size, |m| m.size),
                approx: here.is_none() && e.sha256.is_none(),
                installed: here.is_some(),
                description: e.description.to_string(),
                license: e.license.to_string(),
            }
        })
        .collect();
    for m in installed {
        if !out.iter().any(|i| i.name == m.name) {
            out.push(Item {
                name: m.name.clone(),
                category: None,
                size: m.size,
                approx: false,
                installed: true,
                description: format!("in the store: {}", m.path.display()),
                license: String::new(),
            });
        }
    }
    out
}

/// Which models the list shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    All,
    Category(Category),
    Installed,
}

impl Filter {
    /// The tabs, in order.
    pub fn all() -> Vec<Filter> {
        let mut v = vec![Filter::All];
        v.extend(Category::ALL.map(Filter::Category));
        v.push(Filter::Installed);
        v
    }

    pub fn label(self) -> &'static str {
        match self {
            Filter::All => "all",
            Filter::Category(c) => c.as_str(),
            Filter::Installed => "installed",
        }
    }

    fn keeps(self, item: &Item) -> bool {
        match self {
            Filter::All => true,
            Filter::Category(c) => item.category == Some(c),
            Filter::Installed => item.installed,
        }
    }
}

/// What the keys currently do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Normal,
    /// Typing a search (the query is [`App::query`]).
    Search,
    /// Asking whether to delete the named model.
    ConfirmDelete(String),
    Help,
}

/// A download in progress.
#[derive(Debug, Clone, PartialEq)]
pub struct Download {
    pub name: String,
    pub phase: Option<Phase>,
    pub done: u64,
    pub total: Option<u64>,
    /// The latest status line of the store.
    pub status: String,
}

/// A key, as the app understands it (the terminal layer maps its events to these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Char(char),
    Up,
    Down,
    Left,
    Right,
    PageUp,
    PageDown,
    Home,
    End,
    Tab,
    BackTab,
    Enter,
    Esc,
    Backspace,
    Delete,
    CtrlC,
}

/// What the caller must do after a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    None,
    Quit,
    /// Start pulling this catalog model.
    Download(String),
    /// Remove this model from the store (already confirmed).
    Delete(String),
    /// Leave and chat with this installed model.
    Chat(String),
}

pub struct App {
    pub items: Vec<Item>,
    pub filter: Filter,
    pub query: String,
    pub mode: Mode,
    /// Index into [`App::visible`].
    pub selected: usize,
    pub download: Option<Download>,
    /// A one-line message for the footer (the last result or error).
    pub message: String,
}

impl App {
    pub fn new(items: Vec<Item>) -> App {
        App {
            items,
            filter: Filter::All,
            query: String::new(),
            mode: Mode::Normal,
            selected: 0,
            download: None,
            message: String::from("? for help"),
        }
    }

    /// The items the current filter and search show.
    pub fn visible(&self) -> Vec<&Item> {
        let q = self.query.to_lowercase();
        self.items
            .iter()
            .filter(|i| self.filter.keeps(i))
            .filter(|i| {
                q.is_empty()
                    || i.name.to_lowercase().contains(&q)
                    || i.description.to_lowercase().contains(&q)
            })
            .collect()
    }

    pub fn current(&self) -> Option<&Item> {
        self.visible().get(self.selected).copied()
    }

    /// Replaces the list (after a download or delete), keeping the selection on `name`
    /// when it is still shown.
    pub fn set_items(&mut self, items: Vec<Item>, name: Option<&str>) {
        self.items = items;
        let vis = self.visible();
        self.selected = name
            .and_then(|n| vis.iter().position(|i| i.name == n))
            .unwrap_or(self.selected.min(vis.len().saturating_sub(1)));
    }

    fn clamp(&mut self) {
        let n = self.visible().len();
        self.selected = self.selected.min(n.saturating_sub(1));
    }

    fn step_filter(&mut self, forward: bool) {
        let all = Filter::all();
        let i = all.iter().position(|f| *f == self.filter).unwrap_or(0);
        let j = if forward {
            (i + 1) % all.len()
        } else {
            (i + all.len() - 1) % all.len()
        };
        self.filter = all[j];
        self.selected = 0;
    }

    pub fn on_key(&mut self, key: Key) -> Action {
        if key == Key::CtrlC {
            return Action::Quit;
        }
        match self.mode.clone() {
            Mode::Help => {
                self.mode = Mode::Normal;
                Action::None
            }
            Mode::ConfirmDelete(name) => {
                self.mode = Mode::Normal;
                if matches!(key, Key::Char('y') | Key::Char('Y')) {
                    Action::Delete(name)
                } else {
                    self.message = format!("kept {name}");
                    Action::None
                }
            }
            Mode::Search => {
                match key {
                    Key::Enter => self.mode = Mode::Normal,
                    Key::Esc => {
                        self.query.clear();
                        self.mode = Mode::Normal;
                    }
                    Key::Backspace => {
                        self.query.pop();
                    }
                    Key::Char(c) => self.query.push(c),
                    Key::Up => self.selected = self.selected.saturating_sub(1),
                    Key::Down => self.selected += 1,
                    _ => {}
                }
                self.clamp();
                Action::None
            }
            Mode::Normal => self.normal_key(key),
        }
    }

    fn normal_key(&mut self, key: Key) -> Action {
        let n = self.visible().len();
        match key {
            Key::Char('q') => return Action::Quit,
            Key::Esc if !self.query.is_empty() => self.query.clear(),
            Key::Esc => return Action::Quit,
            Key::Up | Key::Char('k') => self.selected = self.selected.saturating_sub(1),
            Key::Down | Key::Char('j') => self.selected += 1,
            Key::PageUp => self.selected = self.selected.saturating_sub(10),
            Key::PageDown => self.selected += 10,
            Key::Home | Key::Char('g') => self.selected = 0,
            Key::End | Key::Char('G') => self.selected = n.saturating_sub(1),
            Key::Tab | Key::Right | Key::Char('l') => self.step_filter(true),
            Key::BackTab | Key::Left | Key::Char('h') => self.step_filter(false),
            Key::Char('/') => self.mode = Mode::Search,
            Key::Char('?') => self.mode = Mode::Help,
            Key::Char('d') | Key::Enter => return self.download_or_chat(key == Key::Enter),
            Key::Char('x') | Key::Delete => match self.current() {
                Some(i) if i.installed => self.mode = Mode::ConfirmDelete(i.name.clone()),
                Some(i) => self.message = format!("{} is not installed", i.name),
                None => {}
            },
            Key::Char('c') => {
                return match self.current() {
                    Some(i) if i.installed => Action::Chat(i.name.clone()),
                    Some(i) => {
                        self.message = format!("{} is not installed: d downloads it", i.name);
                        Action::None
                    }
                    None => Action::None,
                };
            }
            _ => {}
        }
        self.clamp();
        Action::None
    }

    /// `d` downloads the selected model; Enter downloads it or, when installed, chats.
    fn download_or_chat(&mut self, enter: bool) -> Action {
        let Some(item) = self.current().cloned() else {
            return Action::None;
        };
        if item.installed {
            if enter {
                return Action::Chat(item.name);
            }
            self.message = format!("{} is already installed", item.name);
            return Action::None;
        }
        if let Some(d) = &self.download {
            self.message = format!("already downloading {}; one at a time", d.name);
            return Action::None;
        }
        Action::Download(item.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn app(installed: &[&str]) -> App {
        let inst: Vec<Installed> = installed
            .iter()
            .map(|n| Installed {
                name: n.to_string(),
                path: PathBuf::from(format!("/s/{n}.gguf")),
                kind: mica::hub::Kind::Gguf,
                size: 7,
            })
            .collect();
        App::new(items(&inst))
    }

    #[test]
    fn store_models_outside_the_catalog_are_listed_as_installed() {
        let a = app(&["smollm2-135m-instruct", "my-own"]);
        let own = a.items.iter().find(|i| i.name == "my-own").unwrap();
        assert!(own.installed && own.category.is_none());
        let s = a
            .items
            .iter()
            .find(|i| i.name == "smollm2-135m-instruct")
            .unwrap();
        assert!(s.installed && s.size == 7);
        assert_eq!(a.items.len(), catalog::CATALOG.len() + 1);
    }

    #[test]
    fn tabs_filter_by_category_and_installed() {
        let mut a = app(&["gemma3-270m"]);
        a.on_key(Key::Tab);
        assert_eq!(a.filter, Filter::Category(Category::Chat));
        a.on_key(Key::Tab);
        assert_eq!(a.filter, Filter::Category(Category::Code));
        let v = a.visible();
        assert!(!v.is_empty() && v.iter().all(|i| i.name.contains("coder")));
        a.on_key(Key::Tab);
        assert!(
            a.visible()
                .iter()
                .all(|i| i.category == Some(Category::Base))
        );
        a.on_key(Key::Tab);
        let names: Vec<_> = a.visible().iter().map(|i| i.name.clone()).collect();
        assert_eq!(names, ["gemma3-270m"]);
        a.on_key(Key::BackTab);
        assert_eq!(a.filter, Filter::Category(Category::Base));
    }

    #[test]
    fn search_narrows_and_escape_clears() {
        let mut a = app(&[]);
        a.on_key(Key::Char('/'));
        for c in "qwen3-0".chars() {
            a.on_key(Key::Char(c));
        }
        a.on_key(Key::Enter);
        let names: Vec<_> = a.visible().iter().map(|i| i.name.clone()).collect();
        assert_eq!(names, ["qwen3-0.6b"]);
        assert_eq!(
            a.on_key(Key::Char('d')),
            Action::Download("qwen3-0.6b".into())
        );
        a.on_key(Key::Esc);
        assert_eq!(a.visible().len(), a.items.len());
        assert_eq!(a.on_key(Key::Esc), Action::Quit);
    }

    #[test]
    fn delete_asks_first_and_only_for_installed_models() {
        let mut a = app(&["gemma3-270m"]);
        a.on_key(Key::Char('/'));
        a.on_key(Key::Char('g'));
        a.on_key(Key::Char('e'));
        a.on_key(Key::Char('m'));
        a.on_key(Key::Enter);
        let sel = a.current().unwrap().name.clone();
        assert_eq!(sel, "gemma3-270m");
        assert_eq!(a.on_key(Key::Char('x')), Action::None);
        assert_eq!(a.mode, Mode::ConfirmDelete("gemma3-270m".into()));
        assert_eq!(a.on_key(Key::Char('n')), Action::None);
        assert_eq!(a.mode, Mode::Normal);
        a.on_key(Key::Char('x'));
        assert_eq!(
            a.on_key(Key::Char('y')),
            Action::Delete("gemma3-270m".into())
        );
        // Not installed: nothing to delete.
        a.on_key(Key::Down);
        if !a.current().unwrap().installed {
            a.on_key(Key::Char('x'));
            assert_eq!(a.mode, Mode::Normal);
        }
    }

    #[test]
    fn enter_chats_with_installed_and_downloads_others() {
        let mut a = app(&["smollm2-135m-instruct"]);
        assert_eq!(a.current().unwrap().name, "smollm2-135m-instruct");
        assert_eq!(
            a.on_key(Key::Enter),
            Action::Chat("smollm2-135m-instruct".into())
        );
        a.on_key(Key::Down);
        let next = a.current().unwrap().name.clone();
        assert_eq!(a.on_key(Key::Enter), Action::Download(next.clone()));
        a.download = Some(Download {
            name: next,
            phase: None,
            done: 0,
            total: None,
            status: String::new(),
        });
        a.on_key(Key::Down);
        assert_eq!(a.on_key(Key::Char('d')), Action::None);
        assert!(a.message.contains("one at a time"));
    }

    #[test]
    fn selection_stays_in_range() {
        let mut a = app(&[]);
        for _ in 0..100 {
            a.on_key(Key::Down);
        }
        assert_eq!(a.selected, a.visible().len() - 1);
        a.on_key(Key::Char('/'));
        a.on_key(Key::Char('z'));
        a.on_key(Key::Char('z'));
        a.on_key(Key::Char('z'));
        assert!(a.visible().is_empty() && a.current().is_none());
        assert_eq!(a.on_key(Key::Enter), Action::None);
        assert_eq!(a.on_key(Key::Char('d')), Action::None);
    }
}
