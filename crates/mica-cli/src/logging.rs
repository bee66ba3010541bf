//! Diagnostic lines on stderr through the `log` facade: `[mica] LEVEL: message`. The level
//! comes from `MICA_LOG` (`error`, `warn`, `info`, `debug`, `trace`; default `warn`), so
//! default output shows warnings only; load stages and the memory check log at `info`.
//!
//! A dozen lines rather than a logging crate's formatter: the CLI writes one plain format
//! and needs no filtering by module.

use log::{Level, LevelFilter, Log, Metadata, Record};
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether log records are written as JSON lines (`mica serve --log-format json`).
static JSON: AtomicBool = AtomicBool::new(false);

/// Writes log records as one JSON object per line from now on (`event: "log"`, `level`,
/// `message`, `ts`), as `mica serve --log-format json` writes its events.
pub fn set_json(on: bool) {
    JSON.store(on, Ordering::Relaxed);
}

/// Seconds since the Unix epoch, to the millisecond (the `ts` of JSON log lines).
pub fn now_s() -> f64 {
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    (ts * 1e3).round() / 1e3
}

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
            if JSON.load(Ordering::Relaxed) {
                let line = serde_json::json!({
                    "event": "log", "level": level, "message": r.args().to_string(), "ts": now_s()
                });
                eprintln!("{line}");
            } else {
                eprintln!("[mica] {level}: {}", r.args());
            }
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
