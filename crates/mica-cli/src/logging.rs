//! Diagnostic lines on stderr through the `log` facade: `[mica] LEVEL: message`. The level
//! comes from `MICA_LOG` (`error`, `warn`, `info`, `debug`, `trace`; default `warn`), so
//! default output shows warnings only; load stages and the memory check log at `info`.
//!
//! A dozen lines rather than a logging crate's formatter: the CLI writes one plain format
//! and needs no filtering by module.

use log::{Level, LevelFilter, Log, Metadata, Record};

struct StderrLogger;

impl Log for StderrLogger {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &Record) {
        if self.enabled(r.metadata()) {
            let level = match r.level() {
                Level::Error => "error",
                Level::Warn => "warning",
                Level::Info => "info",
                Level::Debug => "debug",
                Level::Trace => "trace",
            };
            eprintln!("[mica] {level}: {}", r.args());
        }
    }

    fn flush(&self) {}
}

/// Installs the logger at the level `MICA_LOG` names (unknown names: `warn`).
pub fn init() {
    let level = std::env::var("MICA_LOG")
        .ok()
        .and_then(|s| s.parse::<LevelFilter>().ok())
        .unwrap_or(LevelFilter::Warn);
    if log::set_logger(&StderrLogger).is_ok() {
        log::set_max_level(level);
    }
}
