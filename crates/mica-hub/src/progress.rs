//! How the store reports what it is doing: a [`Progress`] sink receives [`Event`]s (status
//! lines, and the start, advance and end of each byte transfer), and the caller decides how
//! to show them. The library never draws or prints; the `mica` binary turns these events
//! into progress bars and `mica: …` lines on stderr, a binding could forward them to a
//! Python callback, and passing no sink (`None`) runs silently.

use std::fmt;

/// What a byte transfer is doing; a bar's label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Fetching a file that is verified and discarded on any error (the default model).
    Downloading,
    /// Fetching a file into the store resumably.
    Pulling,
    /// Copying a model out of a wheel (zip) archive.
    Extracting,
    /// Hashing a file already on disk.
    Verifying,
}

impl Phase {
    /// The lowercase word for the phase ("pulling", …).
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Downloading => "downloading",
            Phase::Pulling => "pulling",
            Phase::Extracting => "extracting",
            Phase::Verifying => "verifying",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One thing that happened.
///
/// A transfer is `Start`, any number of `Advance`, then `Finish` (also on failure);
/// transfers do not nest. `done` plus the sum of the advances is the number of bytes the
/// transfer has handled, so for a complete transfer it equals the file's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// A status line for a person, e.g. "pulling gemma3-270m (241.39 MiB, …)".
    Status(&'a str),
    /// A transfer begins: `total` bytes when known, of which `done` are already in place
    /// (a resumed download).
    Start {
        phase: Phase,
        total: Option<u64>,
        done: u64,
    },
    /// `n` more bytes were transferred.
    Advance(u64),
    /// The current transfer ended (finished or failed).
    Finish,
}

/// A receiver of [`Event`]s. Any `Fn(Event)` closure is one.
pub trait Progress {
    fn event(&self, event: Event<'_>);
}

impl<F: Fn(Event<'_>)> Progress for F {
    fn event(&self, event: Event<'_>) {
        self(event)
    }
}

/// An optional [`Progress`], passed around inside the crate.
#[derive(Clone, Copy)]
pub(crate) struct Sink<'a>(pub(crate) Option<&'a dyn Progress>);

impl Sink<'_> {
    pub(crate) fn status(&self, msg: &str) {
        if let Some(p) = self.0 {
            p.event(Event::Status(msg));
        }
    }

    pub(crate) fn start(&self, phase: Phase, total: Option<u64>, done: u64) {
        if let Some(p) = self.0 {
            p.event(Event::Start { phase, total, done });
        }
    }

    pub(crate) fn advance(&self, n: u64) {
        if let Some(p) = self.0 {
            p.event(Event::Advance(n));
        }
    }

    pub(crate) fn finish(&self) {
        if let Some(p) = self.0 {
            p.event(Event::Finish);
        }
    }
}

/// `n` bytes as messages write them: "512 B", "93.81 MiB" (binary prefixes, two decimals:
/// the form the `mica` binary's progress bars use, so a message and a bar agree).
pub fn human_bytes(n: u64) -> String {
    match unit_prefix::NumberPrefix::binary(n as f64) {
        unit_prefix::NumberPrefix::Standalone(n) => format!("{n:.0} B"),
        unit_prefix::NumberPrefix::Prefixed(prefix, n) => format!("{n:.2} {prefix}B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_sizes_as_the_bars_do() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1024), "1.00 KiB");
        assert_eq!(human_bytes(98_362_432), "93.81 MiB");
        assert_eq!(human_bytes(4_680_000_000), "4.36 GiB");
    }

    #[test]
    fn closures_are_sinks() {
        let seen = std::cell::RefCell::new(Vec::new());
        let record = |e: Event<'_>| seen.borrow_mut().push(format!("{e:?}"));
        let sink = Sink(Some(&record));
        sink.status("hello");
        sink.start(Phase::Pulling, Some(10), 4);
        sink.advance(6);
        sink.finish();
        Sink(None).status("nobody hears this");
        assert_eq!(
            *seen.borrow(),
            [
                "Status(\"hello\")",
                "Start { phase: Pulling, total: Some(10), done: 4 }",
                "Advance(6)",
                "Finish"
            ]
        );
    }
}
