//! Request IDs and the one log record each request leaves when it completes.
//!
//! Every request gets an ID: the client's `X-Request-Id` when it sends a usable one (1–128
//! visible ASCII characters), else one the server makes (`req-` and 16 hex digits, unique
//! in the process). [`crate::guard::finish`] returns it in the `X-Request-Id` response
//! header and makes it the task-local [`current`] context of the handler, through which a
//! generation's [`RequestLog`] (held by [`crate::bridge::Running`]) reports the request's
//! record ([`ServerEvent::Request`]) once it ends: finished, failed, or dropped because the
//! client went away. Requests that fail before generating (a 400, a 404) are recorded by
//! the `finish` layer with their status and error. No prompt or output text is recorded
//! unless the server is configured to (`ServerConfig::log_prompts`, `mica serve
//! --log-prompts`): then a generation's record also carries its prompt as the model saw it
//! (the rendered template, special tokens included) and each completion's text.
//!
//! While a generation runs it is listed in the server's live table ([`Live`], the admin
//! route `GET /admin/requests`), from which `DELETE /admin/requests/{id}` cancels it: its
//! completions end with the finish reason `abort` and the engine frees its KV blocks at its
//! next step.

use crate::state::{AppState, ServerEvent};
use mica::engine::{Event, FinishReason, Lane};
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// The request header (and response header) carrying the ID.
pub const HEADER: &str = "x-request-id";

/// What a request did, reported once at its end.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RequestRecord {
    pub id: String,
    pub method: String,
    pub path: String,
    /// The model that ran it (empty when none did).
    pub model: String,
    /// Its priority lane (`interactive`, `background`, `bulk`), empty when none ran.
    pub lane: String,
    pub prompt_tokens: usize,
    /// Prompt tokens found in the prefix cache.
    pub cached_tokens: usize,
    pub generated_tokens: usize,
    /// Time to the first generated token.
    pub ttft_ms: Option<f64>,
    pub total_ms: f64,
    /// Finish reasons of the completions, comma-separated (`stop`, `length`, `abort`,
    /// `error`, `disconnected`), empty without a generation.
    pub finish: String,
    pub status: u16,
    /// The error's message, for failed requests.
    pub error: Option<String>,
    /// The prompt's text, only when the server logs prompts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Each completion's text, only when the server logs prompts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Vec<String>>,
}

/// A running generation, as the live table lists it.
pub struct Live {
    pub method: String,
    pub path: String,
    pub model: String,
    pub lane: Lane,
    pub started: Instant,
    pub prompt_tokens: usize,
    /// Tokens generated so far (all completions).
    pub generated: Arc<AtomicUsize>,
    /// Set to cancel the generation.
    pub cancel: watch::Sender<bool>,
}

/// One row of `GET /admin/requests`.
#[derive(Serialize)]
pub struct LiveRow {
    pub id: String,
    pub method: String,
    pub path: String,
    pub model: String,
    pub lane: &'static str,
    /// `waiting` (queued, or its prompt being processed) until the first token, then
    /// `generating`.
    pub state: &'static str,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub age_ms: f64,
}

impl Live {
    pub fn row(&self, id: &str) -> LiveRow {
        let generated = self.generated.load(Ordering::Relaxed);
        LiveRow {
            id: id.to_string(),
            method: self.method.clone(),
            path: self.path.clone(),
            model: self.model.clone(),
            lane: self.lane.as_str(),
            state: if generated > 0 {
                "generating"
            } else {
                "waiting"
            },
            prompt_tokens: self.prompt_tokens,
            generated_tokens: generated,
            age_ms: self.started.elapsed().as_secs_f64() * 1e3,
        }
    }
}

/// A request's ID and where its record goes, for the handler's task.
#[derive(Clone)]
pub struct Context {
    pub id: String,
    pub method: String,
    pub path: String,
    pub state: Arc<AppState>,
}

tokio::task_local! {
    static CURRENT: Context;
}

/// Runs `f` with `ctx` as the [`current`] request.
pub async fn scope<F: std::future::Future>(ctx: Context, f: F) -> F::Output {
    CURRENT.scope(ctx, f).await
}

/// The request the current task serves, if any.
pub fn current() -> Option<Context> {
    CURRENT.try_with(Context::clone).ok()
}

/// The client's ID when usable, else a new one.
pub fn id_for(client: Option<&str>) -> String {
    if let Some(c) = client
        && (1..=128).contains(&c.len())
        && c.bytes().all(|b| b.is_ascii_graphic())
    {
        return c.to_string();
    }
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // Unique in the process (the counter) and unlikely to repeat across restarts (the
    // start time's bits above it).
    format!(
        "req-{:016x}",
        (t.rotate_left(20) & !0xFFFFF) | (n & 0xFFFFF)
    )
}

/// The record of a generation in progress; reports it when the generation ends, or when
/// dropped before that (the client went away).
pub struct RequestLog {
    ctx: Context,
    model: String,
    lane: Lane,
    started: Instant,
    first_token: Option<f64>,
    generated: Arc<AtomicUsize>,
    finish: Vec<Option<FinishReason>>,
    done: bool,
    /// The prompt and each completion's text so far, when the server logs prompts.
    text: Option<(String, Vec<String>)>,
}

impl RequestLog {
    /// A log for a generation of `n` completions of a `prompt_tokens`-token prompt on
    /// `model`, in the current request's context (`None` outside a request, e.g. in library
    /// tests), listed in the live table with `cancel` as its cancel switch. `prompt_text`
    /// is called only when the server logs prompts.
    pub fn start(
        model: &str,
        lane: Lane,
        n: usize,
        prompt_tokens: usize,
        cancel: watch::Sender<bool>,
        prompt_text: impl FnOnce() -> String,
    ) -> Option<RequestLog> {
        let ctx = current()?;
        let text = ctx
            .state
            .cfg
            .log_prompts
            .then(|| (prompt_text(), vec![String::new(); n]));
        let generated = Arc::new(AtomicUsize::new(0));
        ctx.state.live().insert(
            ctx.id.clone(),
            Live {
                method: ctx.method.clone(),
                path: ctx.path.clone(),
                model: model.to_string(),
                lane,
                started: Instant::now(),
                prompt_tokens,
                generated: generated.clone(),
                cancel,
            },
        );
        Some(RequestLog {
            ctx,
            model: model.to_string(),
            lane,
            started: Instant::now(),
            first_token: None,
            generated,
            finish: vec![None; n],
            done: false,
            text,
        })
    }

    /// Notes one engine event; reports the record at the request's last one.
    pub fn see(&mut self, ev: &Event) {
        match ev {
            Event::Token { index, text, .. } => {
                self.first_token
                    .get_or_insert_with(|| self.started.elapsed().as_secs_f64() * 1e3);
                self.generated.fetch_add(1, Ordering::Relaxed);
                self.add_text(*index, text);
            }
            Event::Done {
                index,
                finish,
                text,
            } => {
                if let Some(f) = self.finish.get_mut(*index) {
                    *f = Some(*finish);
                }
                self.add_text(*index, text);
            }
            Event::Finished { usage } => {
                let (p, c) = (usage.prompt_tokens, usage.cached_tokens);
                self.report(p, c, None);
            }
            Event::Error(e) => self.report(0, 0, Some(e.to_string())),
        }
    }

    fn add_text(&mut self, index: usize, text: &str) {
        if let Some(out) = self.text.as_mut().and_then(|t| t.1.get_mut(index)) {
            out.push_str(text);
        }
    }

    fn report(&mut self, prompt_tokens: usize, cached_tokens: usize, error: Option<String>) {
        if self.done {
            return;
        }
        self.done = true;
        self.ctx.state.live().remove(&self.ctx.id);
        let finish = self
            .finish
            .iter()
            .map(|f| match (f, &error) {
                (_, Some(_)) => "error",
                (Some(f), None) => crate::bridge::finish_reason(Some(*f)),
                (None, None) => "disconnected",
            })
            .collect::<Vec<_>>()
            .join(",");
        let rec = RequestRecord {
            id: self.ctx.id.clone(),
            method: self.ctx.method.clone(),
            path: self.ctx.path.clone(),
            model: self.model.clone(),
            lane: self.lane.as_str().to_string(),
            prompt_tokens,
            cached_tokens,
            generated_tokens: self.generated.load(Ordering::Relaxed),
            ttft_ms: self.first_token,
            total_ms: self.started.elapsed().as_secs_f64() * 1e3,
            finish,
            status: if error.is_some() { 500 } else { 200 },
            error,
            prompt: self.text.as_ref().map(|t| t.0.clone()),
            output: self.text.as_mut().map(|t| std::mem::take(&mut t.1)),
        };
        self.ctx.state.emit(ServerEvent::Request(rec));
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        // Ended before the engine finished it: the client went away.
        self.report(0, 0, None);
    }
}
