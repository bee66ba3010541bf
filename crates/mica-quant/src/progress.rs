//! How the long operations of this crate report what they are doing: a stream of
//! [`Event`]s passed to a callback (`&mut dyn FnMut(Event)`), from the calling thread only.
//! The library never draws or prints; the `mica` binary turns tasks into progress bars and
//! notices into `warning:` / `note:` lines, a binding can forward them as it likes, and a
//! caller that wants none passes [`ignore`].
//!
//! A task is bracketed by [`Event::Start`] and [`Event::Finish`]; between them,
//! [`Event::Advance`] steps sum to the task's total. Tasks do not nest.

use std::fmt;
use std::path::PathBuf;

/// One thing a long operation reports.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A task begins, with `total` units of [`Task::unit`] to do.
    Start { task: Task, total: u64 },
    /// What the current task works on now (a tensor's name).
    Item(String),
    /// `n` more units of the current task are done.
    Advance(u64),
    /// The running perplexity after the windows scored so far.
    Perplexity(f64),
    /// The current task is done.
    Finish,
    /// Something the user should know, as it is found.
    Notice(Notice),
}

/// The tasks that report progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    /// Running the model over calibration windows (importance matrix, Gram matrices).
    Calibrate,
    /// Measuring each mixable tensor's effect on the model (`--mix` with calibration text).
    Sensitivity,
    /// Writing the output file's tensors.
    Write,
    /// Scoring windows of text (perplexity, KL-divergence).
    Perplexity,
}

impl Task {
    /// The unit of the task's total and advances.
    pub fn unit(self) -> &'static str {
        match self {
            Task::Calibrate | Task::Perplexity => "windows",
            Task::Sensitivity => "tensors",
            Task::Write => "bytes",
        }
    }
}

/// A warning or note. `Display` gives the text (without a `warning:` prefix);
/// [`Notice::is_warning`] says which of the two it is.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Notice {
    /// `--mix` without an importance matrix.
    MixUnweighted,
    /// `--mix` without calibration text.
    MixUncalibrated,
    /// Tensors that are already quantized get another quantized type.
    Requantizing {
        tensors: usize,
        example: String,
        example_type: String,
    },
    /// The importance matrix's entry for `tensor` does not match its rows.
    ImatrixColumns {
        tensor: String,
        columns: usize,
        row_len: u64,
    },
    /// A Hugging Face model attends within a sliding window GGUF `arch` cannot express.
    SlidingWindowDropped { window: usize, arch: String },
    /// A Hugging Face folder without `tokenizer.json`.
    NoTokenizer { dir: PathBuf },
    /// The KL probe's quantized source is too large to expand to f32.
    ProbeNotExpanded { mib: usize },
}

impl Notice {
    /// A warning (the result may not be what was asked for), rather than a note.
    pub fn is_warning(&self) -> bool {
        !matches!(
            self,
            Notice::MixUncalibrated | Notice::ProbeNotExpanded { .. }
        )
    }
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::MixUnweighted => write!(
                f,
                "--mix without --imatrix or --calibrate: sensitivities assume equal \
                 activations in every column"
            ),
            Notice::MixUncalibrated => write!(
                f,
                "--mix without --calibrate compares tensors by their own output error; with \
                 --calibrate TEXT it measures each one's effect on the model's predictions \
                 (KL-divergence), which chooses better"
            ),
            Notice::Requantizing {
                tensors,
                example,
                example_type,
            } => write!(
                f,
                "requantizing {tensors} tensors that are already quantized (e.g. '{example}' \
                 is {example_type}): errors compound; convert from an F32/F16/BF16 source for \
                 the best quality"
            ),
            Notice::ImatrixColumns {
                tensor,
                columns,
                row_len,
            } => write!(
                f,
                "the importance matrix has {columns} columns for '{tensor}', whose rows have \
                 {row_len}; quantizing it unweighted"
            ),
            Notice::SlidingWindowDropped { window, arch } => write!(
                f,
                "the model attends within a sliding window of {window} tokens; GGUF '{arch}' \
                 has no key for it (llama.cpp's converter drops it too), so the output attends \
                 to the whole context and differs from the folder beyond {window} tokens"
            ),
            Notice::NoTokenizer { dir } => write!(
                f,
                "{} has no tokenizer.json: the output has no vocabulary (fine for tests; mica \
                 run and llama.cpp need one)",
                dir.display()
            ),
            Notice::ProbeNotExpanded { mib } => write!(
                f,
                "the source is quantized and too large to measure sensitivities in f32 \
                 ({mib} MiB); the measurements carry the noise of 8-bit activations"
            ),
        }
    }
}

/// A callback that drops every event.
pub fn ignore(_: Event) {}
