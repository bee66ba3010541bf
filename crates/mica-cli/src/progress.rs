//! Draws the progress of `mica-quant`'s long operations: each task becomes an indicatif bar
//! (hidden with `--quiet`), and notices become `warning:` / `note:` lines on stderr, printed
//! with or without `--quiet`.

use indicatif::{ProgressBar, ProgressStyle};
use mica::quant::{Event, Task};

/// The bar of the task in progress, if any.
pub struct Progress {
    quiet: bool,
    bar: Option<ProgressBar>,
}

impl Progress {
    pub fn new(quiet: bool) -> Progress {
        Progress { quiet, bar: None }
    }

    /// Handles one event of a `mica-quant` operation.
    pub fn handle(&mut self, event: Event) {
        match event {
            Event::Start { task, total } => {
                self.bar = Some(self.start(task, total));
            }
            Event::Item(name) => self.with_bar(|b| b.set_message(name)),
            Event::Advance(n) => self.with_bar(|b| b.inc(n)),
            Event::Perplexity(ppl) => self.with_bar(|b| b.set_message(format!("PPL {ppl:.4}"))),
            Event::Finish => {
                if let Some(b) = self.bar.take() {
                    b.finish_and_clear();
                }
            }
            Event::Notice(n) => {
                let level = if n.is_warning() { "warning" } else { "note" };
                let print = || eprintln!("{level}: {n}");
                match &self.bar {
                    Some(b) => b.suspend(print),
                    None => print(),
                }
            }
            _ => {}
        }
    }

    fn with_bar(&self, f: impl FnOnce(&ProgressBar)) {
        if let Some(b) = &self.bar {
            f(b);
        }
    }

    fn start(&self, task: Task, total: u64) -> ProgressBar {
        if self.quiet {
            return ProgressBar::hidden();
        }
        let template = match task {
            Task::Write => "{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
            Task::Sensitivity => "sensitivity {bar:30} {pos}/{len} tensors ETA {eta} {msg}",
            Task::Calibrate => "calibrating {bar:30} {pos}/{len} windows ETA {eta}",
            Task::Perplexity => "{bar:30} {pos}/{len} windows ETA {eta} {msg}",
        };
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    }
}
