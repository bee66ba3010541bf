//! Drawing `mica browse`: filter tabs, the model table, the selected model's details, a
//! download gauge, a footer of keys, and the help and delete-confirmation pop-ups.

use super::app::{App, Filter, Mode};
use mica::hub::human_bytes;
use ratatui::Frame;
use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::style::{Modifier, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Clear, Gauge, Paragraph, Row, Table, TableState, Tabs, Wrap};

/// The keys, as the help pop-up lists them.
pub const HELP: &[(&str, &str)] = &[
    ("↑ ↓  j k", "move"),
    ("PgUp PgDn  g G", "page, first, last"),
    (
        "Tab Shift-Tab  ← →",
        "category: all, chat, code, base, installed",
    ),
    (
        "/",
        "search names and descriptions (Enter keeps it, Esc clears)",
    ),
    ("d", "download the selected model"),
    (
        "Enter",
        "chat with an installed model (download one that is not)",
    ),
    ("c", "chat with the selected model"),
    (
        "x  Delete",
        "delete the selected model from the store (asks first)",
    ),
    ("?", "this help"),
    ("q  Esc", "quit"),
];

pub fn draw(f: &mut Frame, app: &App) {
    let [tabs, body, details, gauge, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(5),
        Constraint::Length(4),
        Constraint::Length(if app.download.is_some() { 3 } else { 0 }),
        Constraint::Length(1),
    ])
    .areas(f.area());
    draw_tabs(f, app, tabs);
    draw_table(f, app, body);
    draw_details(f, app, details);
    if app.download.is_some() {
        draw_gauge(f, app, gauge);
    }
    draw_footer(f, app, footer);
    match &app.mode {
        Mode::Help => draw_help(f),
        Mode::ConfirmDelete(name) => draw_confirm(f, name),
        _ => {}
    }
}

fn draw_tabs(f: &mut Frame, app: &App, area: Rect) {
    let all = Filter::all();
    let sel = all.iter().position(|x| *x == app.filter).unwrap_or(0);
    let titles: Vec<Line> = all.iter().map(|x| Line::from(x.label())).collect();
    let tabs = Tabs::new(titles)
        .select(sel)
        .highlight_style(Style::new().bold().reversed())
        .divider("|");
    let [left, right] =
        Layout::horizontal([Constraint::Min(10), Constraint::Length(40)]).areas(area);
    f.render_widget(tabs, left);
    let search = match (&app.mode, app.query.is_empty()) {
        (Mode::Search, _) => format!("search: {}_", app.query),
        (_, false) => format!("search: {}", app.query),
        _ => String::new(),
    };
    f.render_widget(Paragraph::new(search).right_aligned(), right);
}

fn draw_table(f: &mut Frame, app: &App, area: Rect) {
    let vis = app.visible();
    let rows: Vec<Row> = vis
        .iter()
        .map(|i| {
            let size = if i.approx {
                format!("~{}", human_bytes(i.size))
            } else {
                human_bytes(i.size)
            };
            let downloading = app.download.as_ref().is_some_and(|d| d.name == i.name);
            let state = if downloading {
                "downloading"
            } else if i.installed {
                "installed"
            } else {
                ""
            };
            Row::new(vec![
                Cell::from(i.name.clone()),
                Cell::from(i.category.map_or("local", |c| c.as_str())),
                Cell::from(size),
                Cell::from(state),
                Cell::from(i.description.clone()),
            ])
        })
        .collect();
    let title = format!(" mica models: {} of {} ", vis.len(), app.items.len());
    let table = Table::new(
        rows,
        [
            Constraint::Length(28),
            Constraint::Length(6),
            Constraint::Length(12),
            Constraint::Length(11),
            Constraint::Min(10),
        ],
    )
    .header(Row::new(["NAME", "KIND", "SIZE", "STATE", "DESCRIPTION"]).bold())
    .block(Block::bordered().title(title))
    .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
    .highlight_symbol("> ");
    let mut state = TableState::default().with_selected((!vis.is_empty()).then_some(app.selected));
    f.render_stateful_widget(table, area, &mut state);
    if vis.is_empty() {
        let msg = Paragraph::new("no models match (Esc clears the search, Tab changes category)");
        let inner = Rect {
            x: area.x + 2,
            y: area.y + 2,
            width: area.width.saturating_sub(4),
            height: 1,
        };
        f.render_widget(msg, inner);
    }
}

fn draw_details(f: &mut Frame, app: &App, area: Rect) {
    let text = match app.current() {
        Some(i) => vec![
            Line::from(vec![
                Span::from(i.name.clone()).bold(),
                Span::from(format!("  {}", i.description)),
            ]),
            Line::from(if i.license.is_empty() {
                String::new()
            } else {
                format!("license: {}", i.license)
            }),
        ],
        None => vec![Line::from("")],
    };
    f.render_widget(
        Paragraph::new(text)
            .wrap(Wrap { trim: true })
            .block(Block::bordered()),
        area,
    );
}

fn draw_gauge(f: &mut Frame, app: &App, area: Rect) {
    let Some(d) = &app.download else { return };
    let phase = d.phase.map_or("starting", |p| p.as_str());
    let (ratio, label) = match d.total {
        Some(t) if t > 0 => {
            let r = (d.done as f64 / t as f64).clamp(0.0, 1.0);
            (
                r,
                format!(
                    "{phase} {}: {} / {} ({:.0}%)",
                    d.name,
                    human_bytes(d.done),
                    human_bytes(t),
                    r * 100.0
                ),
            )
        }
        _ => (0.0, format!("{phase} {}: {}", d.name, human_bytes(d.done))),
    };
    let title = if d.status.is_empty() {
        " download ".to_string()
    } else {
        format!(" {} ", d.status)
    };
    f.render_widget(
        Gauge::default()
            .block(Block::bordered().title(title))
            .ratio(ratio)
            .label(label),
        area,
    );
}

fn draw_footer(f: &mut Frame, app: &App, area: Rect) {
    let keys = match app.mode {
        Mode::Search => "type to search · Enter keep · Esc clear",
        _ => "↑↓ move · Tab category · / search · d download · c chat · x delete · ? help · q quit",
    };
    let [l, r] = Layout::horizontal([Constraint::Min(10), Constraint::Length(44)]).areas(area);
    f.render_widget(Paragraph::new(keys).dim(), l);
    f.render_widget(Paragraph::new(app.message.clone()).right_aligned(), r);
}

fn popup(area: Rect, w: u16, h: u16) -> Rect {
    let [v] = Layout::vertical([Constraint::Length(h)])
        .flex(Flex::Center)
        .areas(area);
    let [c] = Layout::horizontal([Constraint::Length(w)])
        .flex(Flex::Center)
        .areas(v);
    c
}

fn draw_help(f: &mut Frame) {
    let lines: Vec<Line> = HELP
        .iter()
        .map(|(k, v)| {
            Line::from(vec![
                Span::from(format!("{k:>20}  ")).bold(),
                Span::from(*v),
            ])
        })
        .collect();
    let area = popup(f.area(), 84, HELP.len() as u16 + 2);
    f.render_widget(Clear, area);
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" keys (any key closes) ")),
        area,
    );
}

fn draw_confirm(f: &mut Frame, name: &str) {
    let area = popup(f.area(), (name.len() as u16 + 30).max(40), 3);
    f.render_widget(Clear, area);
    f.render_widget(
        Paragraph::new(format!("delete {name}? y / n")).block(Block::bordered().title(" delete ")),
        area,
    );
}
