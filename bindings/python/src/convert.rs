//! `mica.convert`: GGUF / `.mica` / Hugging Face folder into GGUF or `.mica`, optionally
//! quantized, as `mica convert` does — the same options, progress to an optional Python
//! callback, the report as a dict.

use crate::errors::{IntoPyResult, raise};
use mica::quant::{
    Calibration, ConvertOptions, Event, FileType, Imatrix, Importance, Task, TensorTypeRule,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::{Path, PathBuf};

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn task_name(t: Task) -> &'static str {
    match t {
        Task::Calibrate => "calibrate",
        Task::Sensitivity => "sensitivity",
        Task::Write => "write",
        Task::Perplexity => "perplexity",
    }
}

/// What the conversion reports along the way, for the Python callback and the report.
enum Report {
    Start(&'static str, u64),
    Item(String),
    Advance(u64),
    Finish,
    Notice(String, bool),
}

/// Converts `src` into `dst` (GGUF or `.mica`, by extension). See `mica.convert`.
#[pyfunction]
#[pyo3(signature = (
    src, dst, *, r#type=None, mix=None, tensor_types=Vec::new(), imatrix=None,
    calibrate=None, calibrate_ctx=512, calibrate_chunks=None, gptq=false, threads=None,
    progress=None, lora=Vec::new()
))]
pub fn convert<'py>(
    py: Python<'py>,
    src: PathBuf,
    dst: PathBuf,
    r#type: Option<String>,
    mix: Option<f64>,
    tensor_types: Vec<String>,
    imatrix: Option<PathBuf>,
    calibrate: Option<PathBuf>,
    calibrate_ctx: usize,
    calibrate_chunks: Option<usize>,
    gptq: bool,
    threads: Option<usize>,
    progress: Option<Py<PyAny>>,
    lora: Vec<(PathBuf, f32)>,
) -> PyResult<Bound<'py, PyDict>> {
    let file_type = match &r#type {
        None => None,
        Some(t) => Some(FileType::parse(t).ok_or_else(|| {
            raise(
                "InvalidParameter",
                format!("unknown type '{t}' (one of: {})", FileType::names()),
                &[("param", Some("type".into()))],
            )
        })?),
    };
    let tensor_types = tensor_types
        .iter()
        .map(|a| TensorTypeRule::parse(a).map_err(mica::Error::from))
        .collect::<mica::Result<Vec<_>>>()
        .py_err()?;
    let importance = if let Some(p) = &imatrix {
        let m = Imatrix::read(p).map_err(mica::Error::from).py_err()?;
        Importance::Matrix {
            imatrix: m,
            name: file_name(p),
        }
    } else if let Some(p) = &calibrate {
        let text = std::fs::read_to_string(p).map_err(|e| {
            raise(
                "ConvertError",
                format!("cannot read the calibration text {}: {e}", p.display()),
                &[],
            )
        })?;
        Importance::Calibrate(Calibration {
            text,
            name: file_name(p),
            n_ctx: calibrate_ctx,
            max_windows: calibrate_chunks,
            gptq,
        })
    } else {
        Importance::None
    };
    let opts = ConvertOptions {
        file_type,
        mix,
        tensor_types,
        importance,
        threads: threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        lora: lora
            .into_iter()
            .map(|(path, scale)| mica::models::LoraSpec {
                name: None,
                path,
                scale,
            })
            .collect(),
    };
    let (result, notices) = py.detach(|| {
        let mut notices: Vec<(String, bool)> = Vec::new();
        let mut cb_error: Option<PyErr> = None;
        let mut send = |r: Report| {
            if let Report::Notice(m, w) = &r {
                notices.push((m.clone(), *w));
            }
            let Some(cb) = &progress else { return };
            if cb_error.is_some() {
                return;
            }
            let res = Python::attach(|py| -> PyResult<()> {
                let d = PyDict::new(py);
                match r {
                    Report::Start(task, total) => {
                        d.set_item("type", "start")?;
                        d.set_item("task", task)?;
                        d.set_item("total", total)?;
                    }
                    Report::Item(name) => {
                        d.set_item("type", "item")?;
                        d.set_item("name", name)?;
                    }
                    Report::Advance(n) => {
                        d.set_item("type", "advance")?;
                        d.set_item("n", n)?;
                    }
                    Report::Finish => d.set_item("type", "finish")?,
                    Report::Notice(m, w) => {
                        d.set_item("type", "notice")?;
                        d.set_item("message", m)?;
                        d.set_item("warning", w)?;
                    }
                }
                cb.call1(py, (d,))?;
                Ok(())
            });
            if let Err(e) = res {
                cb_error = Some(e);
            }
        };
        let result = mica::convert(&src, &dst, &opts, &mut |e| match e {
            Event::Start { task, total } => send(Report::Start(task_name(task), total)),
            Event::Item(name) => send(Report::Item(name)),
            Event::Advance(n) => send(Report::Advance(n)),
            Event::Finish => send(Report::Finish),
            Event::Notice(n) => send(Report::Notice(n.to_string(), n.is_warning())),
            // Perplexity runs only in `mica perplexity`, never in a conversion.
            _ => {}
        });
        match cb_error {
            Some(e) => Err(e),
            None => Ok((result, notices)),
        }
    })?;
    let report = result.py_err()?;
    let d = PyDict::new(py);
    d.set_item("path", &dst)?;
    d.set_item("tensors", report.tensors)?;
    d.set_item("converted", report.converted)?;
    d.set_item("bytes_written", report.bytes_written)?;
    d.set_item("tensor_bytes", report.tensor_bytes)?;
    d.set_item("weights", report.weights)?;
    d.set_item("source_bytes", report.source_bytes)?;
    d.set_item("seconds", report.seconds)?;
    d.set_item("bits_per_weight", report.bits_per_weight())?;
    d.set_item("gptq_tensors", report.gptq_tensors)?;
    let notes: Vec<(String, bool)> = notices;
    d.set_item("notices", notes)?;
    Ok(d)
}
