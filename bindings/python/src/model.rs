//! `mica._mica.NativeModel`: one opened model with, started on first use, one serving
//! engine (every generation from every Python thread goes through it, so concurrent calls
//! are batched together) and one single-sequence session for raw logits. The Python class
//! `mica.Model` wraps it and shapes the results.
//!
//! Every call that computes releases the GIL (`Python::detach`) and takes the model's own
//! locks only while detached, so a thread waiting for a lock never holds the GIL.

use crate::errors::{IntoPyResult, internal};
use crate::params::Sampling;
use crate::stream::EventStream;
use crate::structured::NativeStructured;
use mica::engine::{Lane, RequestStatus};
use mica::models::tokenizer::DecodeOptions;
use mica::{Engine, EngineOptions, Model, ModelOptions, Request, Session, SessionOptions};
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::sync::{Arc, Mutex};

/// An opened model, its engine and its logits session.
#[pyclass(module = "mica._mica", frozen)]
pub struct NativeModel {
    model: Model,
    engine_opts: EngineOptions,
    session_opts: SessionOptions,
    /// Started by the first generation.
    engine: Mutex<Option<Arc<Engine>>>,
    /// Made by the first `logits` call.
    session: Mutex<Option<Session>>,
}

impl NativeModel {
    /// The engine, started now if it is not running yet.
    fn engine(&self) -> PyResult<Arc<Engine>> {
        let mut slot = self
            .engine
            .lock()
            .map_err(|_| internal("engine lock poisoned"))?;
        if let Some(e) = slot.as_ref() {
            return Ok(e.clone());
        }
        let engine = Arc::new(self.model.engine(self.engine_opts.clone()).py_err()?);
        *slot = Some(engine.clone());
        Ok(engine)
    }
}

#[pymethods]
impl NativeModel {
    /// Opens the model at `path` (a GGUF or `.mica` file or a Hugging Face folder; store
    /// names are resolved by `mica.Model` before this).
    #[new]
    #[pyo3(signature = (path, *, n_ctx=None, n_threads=None, kv_mem=None, max_waiting=None, prefix_caching=true, repack=true, lora=Vec::new(), cache_type_k=None, cache_type_v=None))]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        n_ctx: Option<usize>,
        n_threads: Option<usize>,
        kv_mem: Option<usize>,
        max_waiting: Option<usize>,
        prefix_caching: bool,
        repack: bool,
        lora: Vec<(std::path::PathBuf, f32)>,
        cache_type_k: Option<String>,
        cache_type_v: Option<String>,
    ) -> PyResult<NativeModel> {
        if n_threads == Some(0) {
            return Err(crate::errors::raise(
                "InvalidParameter",
                "n_threads must be at least 1".into(),
                &[("param", Some("n_threads".into()))],
            ));
        }
        if n_ctx == Some(0) {
            return Err(crate::errors::raise(
                "InvalidParameter",
                "n_ctx must be at least 1".into(),
                &[("param", Some("n_ctx".into()))],
            ));
        }
        let lora = lora
            .into_iter()
            .map(|(path, scale)| mica::models::LoraSpec {
                name: None,
                path,
                scale,
            })
            .collect();
        let cache_type = |name: Option<String>, param: &str| {
            name.map(|n| {
                mica::models::kv_cache::KvType::from_name(&n).map_err(|e| {
                    crate::errors::raise(
                        "InvalidParameter",
                        e.to_string(),
                        &[("param", Some(param.into()))],
                    )
                })
            })
            .transpose()
        };
        let opts = ModelOptions {
            repack,
            lora,
            cache_type_k: cache_type(cache_type_k, "cache_type_k")?,
            cache_type_v: cache_type(cache_type_v, "cache_type_v")?,
        };
        let model = py.detach(|| Model::open_with(&path, opts)).py_err()?;
        let mut engine_opts = EngineOptions {
            n_ctx,
            threads: n_threads,
            prefix_caching,
            ..EngineOptions::default()
        };
        if let Some(kv) = kv_mem {
            engine_opts.kv_bytes = kv;
        }
        if let Some(w) = max_waiting {
            engine_opts.max_waiting_per_lane = w;
        }
        Ok(NativeModel {
            model,
            engine_opts,
            session_opts: SessionOptions {
                n_ctx,
                threads: n_threads,
            },
            engine: Mutex::new(None),
            session: Mutex::new(None),
        })
    }

    /// The file or folder the model was opened from.
    #[getter]
    fn path(&self) -> std::path::PathBuf {
        self.model.path().to_path_buf()
    }

    /// Size of the vocabulary (the logits' length).
    #[getter]
    fn n_vocab(&self) -> usize {
        self.model.n_vocab()
    }

    /// The context the model was trained with.
    #[getter]
    fn n_ctx_train(&self) -> usize {
        self.model.n_ctx_train()
    }

    /// Positions one sequence may reach: the engine's when it runs, else what was asked
    /// for (or the model's default).
    #[getter]
    fn n_ctx(&self) -> PyResult<usize> {
        let slot = self
            .engine
            .lock()
            .map_err(|_| internal("engine lock poisoned"))?;
        Ok(match slot.as_ref() {
            Some(e) => e.n_ctx(),
            None => self
                .engine_opts
                .n_ctx
                .unwrap_or_else(|| self.model.default_n_ctx()),
        })
    }

    /// The model's architecture name as its file states it (`llama`, `qwen2`, ...).
    #[getter]
    fn architecture(&self) -> String {
        self.model.loaded().model.config.arch.clone()
    }

    #[pyo3(signature = (text, add_special=true, parse_special=true))]
    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> PyResult<Vec<u32>> {
        self.model
            .tokenize_with(text, add_special, parse_special)
            .py_err()
    }

    fn detokenize(&self, ids: Vec<u32>) -> PyResult<String> {
        self.model.detokenize(&ids).py_err()
    }

    /// The bytes a token stands for (special tokens as their text); `None` for an id
    /// outside the vocabulary.
    fn token_piece<'py>(&self, py: Python<'py>, id: u32) -> Option<Bound<'py, PyBytes>> {
        self.model
            .loaded()
            .tokenizer
            .token_piece(
                id,
                DecodeOptions {
                    skip_special: false,
                },
            )
            .map(|b| PyBytes::new(py, b))
    }

    /// Checks and compiles a request's output constraint (`(kind, text)`: `json_object`,
    /// `json_schema` with the schema, `grammar`, `regex`, `choice` with a JSON list) and
    /// tools (a JSON list of OpenAI tool objects, with `tool_choice` as JSON), without the
    /// GIL. Errors raise `InvalidParameter` naming the argument.
    #[pyo3(signature = (constraint=None, tools=None, tool_choice=None, parallel_tool_calls=false))]
    fn structured(
        &self,
        py: Python<'_>,
        constraint: Option<(String, String)>,
        tools: Option<String>,
        tool_choice: Option<String>,
        parallel_tool_calls: bool,
    ) -> PyResult<NativeStructured> {
        py.detach(|| {
            NativeStructured::prepare(
                &self.model,
                constraint,
                tools,
                tool_choice,
                parallel_tool_calls,
            )
        })
    }

    /// The prompt tokens of a conversation given as JSON (OpenAI messages with text
    /// content, tool calls and tool results), with `structured`'s tools given to the chat
    /// template.
    #[pyo3(signature = (messages, structured=None))]
    fn chat_prompt(
        &self,
        messages: &str,
        structured: Option<PyRef<'_, NativeStructured>>,
    ) -> PyResult<Vec<u32>> {
        let msgs = crate::structured::messages(messages)?;
        match structured.as_ref().and_then(|s| s.template_tools()) {
            Some(tools) => self.model.chat_prompt_with_tools(&msgs, &tools).py_err(),
            None => self.model.chat_prompt(&msgs).py_err(),
        }
    }

    /// Logits after `ids`, evaluated from an empty cache: the last position's
    /// (`[n_vocab]`), or with `all` every position's (`[len(ids), n_vocab]`).
    #[pyo3(signature = (ids, all=false))]
    fn logits<'py>(
        &self,
        py: Python<'py>,
        ids: Vec<u32>,
        all: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let n_vocab = self.model.n_vocab();
        let n = ids.len();
        let values = py.detach(|| -> PyResult<Vec<f32>> {
            let mut slot = self
                .session
                .lock()
                .map_err(|_| internal("session lock poisoned"))?;
            let session = slot.get_or_insert_with(|| self.model.session(self.session_opts));
            if all {
                session.logits_all(&ids).py_err()
            } else {
                session.logits(&ids).py_err()
            }
        })?;
        if all {
            let arr = Array2::from_shape_vec((n, n_vocab), values)
                .map_err(|e| internal(&format!("logits shape: {e}")))?;
            Ok(arr.into_pyarray(py).into_any())
        } else {
            Ok(PyArray1::from_vec(py, values).into_any())
        }
    }

    /// Embeddings of `texts` (a string or a list of strings) as a `[len(texts), n_embd]`
    /// float32 array: pooled as the model declares (the last token for a decoder LM that
    /// declares nothing, as `mica embed` and the server), L2-normalized unless
    /// `normalize=False`. Computed without the GIL.
    #[pyo3(signature = (texts, normalize=true))]
    fn embed<'py>(
        &self,
        py: Python<'py>,
        texts: Bound<'py, PyAny>,
        normalize: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let texts: Vec<String> = match texts.extract::<String>() {
            Ok(one) => vec![one],
            Err(_) => texts.extract()?,
        };
        let opts = mica::EmbedOptions {
            normalize,
            ..Default::default()
        };
        let rows = py.detach(|| self.model.embed(&texts, &opts)).py_err()?;
        let dim = rows.first().map_or(0, Vec::len);
        let arr = Array2::from_shape_vec((rows.len(), dim), rows.concat())
            .map_err(|e| internal(&format!("embedding shape: {e}")))?;
        Ok(arr.into_pyarray(py).into_any())
    }

    /// Queues a request on the engine; its events come from the returned stream.
    #[pyo3(signature = (
        prompt, *, max_tokens=None, temperature=None, top_k=None, top_p=None, min_p=None,
        repeat_penalty=None, presence_penalty=None, frequency_penalty=None,
        penalty_last_n=None, seed=None, stop=Vec::new(), ignore_eos=false,
        logit_bias=Vec::new(), n=1, logprobs=None, lane=None, typical_p=None,
        xtc_probability=None, xtc_threshold=None, dry_multiplier=None, dry_base=None,
        dry_allowed_length=None, dry_penalty_last_n=None, dry_sequence_breakers=None,
        structured=None
    ))]
    fn submit(
        &self,
        py: Python<'_>,
        prompt: Vec<u32>,
        max_tokens: Option<usize>,
        temperature: Option<f32>,
        top_k: Option<usize>,
        top_p: Option<f32>,
        min_p: Option<f32>,
        repeat_penalty: Option<f32>,
        presence_penalty: Option<f32>,
        frequency_penalty: Option<f32>,
        penalty_last_n: Option<usize>,
        seed: Option<u64>,
        stop: Vec<String>,
        ignore_eos: bool,
        logit_bias: Vec<(u32, f32)>,
        n: usize,
        logprobs: Option<usize>,
        lane: Option<&str>,
        typical_p: Option<f32>,
        xtc_probability: Option<f32>,
        xtc_threshold: Option<f32>,
        dry_multiplier: Option<f32>,
        dry_base: Option<f32>,
        dry_allowed_length: Option<u32>,
        dry_penalty_last_n: Option<i32>,
        dry_sequence_breakers: Option<Vec<String>>,
        structured: Option<PyRef<'_, NativeStructured>>,
    ) -> PyResult<EventStream> {
        let d = mica::SamplingParams::default();
        let engine = py.detach(|| self.engine())?;
        let sampling = Sampling {
            // No limit: until the context is full (the engine ends it there).
            max_tokens: max_tokens.unwrap_or_else(|| engine.n_ctx()),
            temperature: temperature.unwrap_or(d.temperature),
            top_k: top_k.unwrap_or(d.top_k),
            top_p: top_p.unwrap_or(d.top_p),
            min_p: min_p.unwrap_or(d.min_p),
            repeat_penalty: repeat_penalty.unwrap_or(d.repeat_penalty),
            presence_penalty: presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: frequency_penalty.unwrap_or(d.frequency_penalty),
            penalty_last_n: penalty_last_n.unwrap_or(d.penalty_last_n),
            seed,
            stop,
            ignore_eos,
            logit_bias,
            typical_p: typical_p.unwrap_or(d.typical_p),
            xtc_probability: xtc_probability.unwrap_or(d.xtc_probability),
            xtc_threshold: xtc_threshold.unwrap_or(d.xtc_threshold),
            dry_multiplier: dry_multiplier.unwrap_or(d.dry_multiplier),
            dry_base: dry_base.unwrap_or(d.dry_base),
            dry_allowed_length: dry_allowed_length.unwrap_or(d.dry_allowed_length),
            dry_penalty_last_n: dry_penalty_last_n.unwrap_or(d.dry_penalty_last_n),
            dry_sequence_breakers: dry_sequence_breakers.unwrap_or(d.dry_sequence_breakers),
        };
        let mut req = Request::new(prompt, sampling.into_params());
        req.n = n;
        req.logprobs = logprobs;
        if let Some(g) = structured.as_ref().and_then(|s| s.grammar.as_ref()) {
            req = req.constrained(g);
        }
        if let Some(name) = lane {
            req.lane = Lane::parse(name).ok_or_else(|| {
                crate::errors::raise(
                    "InvalidParameter",
                    format!("unknown lane {name:?} (interactive, background or bulk)"),
                    &[("param", Some("lane".into()))],
                )
            })?;
        }
        let stream = engine.submit(req).py_err()?;
        Ok(EventStream::new(stream))
    }

    /// The engine's gauges and counters (zeros before it starts).
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        use std::sync::atomic::Ordering::Relaxed;
        let d = PyDict::new(py);
        let slot = self
            .engine
            .lock()
            .map_err(|_| internal("engine lock poisoned"))?;
        let Some(engine) = slot.as_ref() else {
            d.set_item("started", false)?;
            return Ok(d);
        };
        let m = engine.metrics();
        d.set_item("started", true)?;
        d.set_item("running", m.running.load(Relaxed))?;
        let waiting: u64 = m.waiting.iter().map(|w| w.load(Relaxed)).sum();
        d.set_item("waiting", waiting)?;
        d.set_item("kv_blocks_total", m.kv_blocks_total.load(Relaxed))?;
        d.set_item("kv_blocks_used", m.kv_blocks_used.load(Relaxed))?;
        d.set_item("kv_blocks_cached", m.kv_blocks_cached.load(Relaxed))?;
        d.set_item("prompt_tokens", m.prompt_tokens.load(Relaxed))?;
        d.set_item("cached_prompt_tokens", m.cached_prompt_tokens.load(Relaxed))?;
        d.set_item("generated_tokens", m.generated_tokens.load(Relaxed))?;
        d.set_item("steps", m.steps.load(Relaxed))?;
        let requests = PyDict::new(py);
        for st in RequestStatus::ALL {
            let total: u64 = Lane::ALL.iter().map(|&l| m.requests(l, st)).sum();
            requests.set_item(st.as_str(), total)?;
        }
        d.set_item("requests", requests)?;
        Ok(d)
    }

    /// The engine's metrics in Prometheus text format, labelled `model="<name>"` (empty
    /// before the engine starts).
    fn metrics_text(&self, name: &str) -> PyResult<String> {
        let slot = self
            .engine
            .lock()
            .map_err(|_| internal("engine lock poisoned"))?;
        let mut out = String::new();
        if let Some(engine) = slot.as_ref() {
            engine.metrics().render(name, &mut out);
        }
        Ok(out)
    }
}
