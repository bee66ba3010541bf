//! The bridge between HTTP handlers and the engine: submitting a request with a sink that
//! feeds a tokio channel, collecting a whole answer, and streaming one as a response body.
//!
//! Cancellation: the sink reports itself closed as soon as the receiving half is dropped —
//! when the client disconnects, hyper drops the response body (streaming) or the handler's
//! future (non-streaming), which drops the receiver — and the engine then cancels the
//! request and frees its KV blocks at its next step.
//!
//! Shutdown: a stream still running when the grace period ends is ended by the server
//! ([`stream_body`]'s abort signal): each unfinished completion gets its final event with
//! the finish reason [`FinishReason::Cancelled`] (`"abort"` on the wire), then the stream's
//! usage and end marker, as if the engine had finished it. A request cancelled through the
//! live table ([`crate::reqlog`]) ends the same way, streamed or not, and its sink reports
//! itself closed so the engine drops it.

use crate::error::ServerError;
use crate::models::Loaded;
use crate::reqlog::RequestLog;
use crate::state::fired;
use axum::body::{Body, Bytes};
use mica::engine::{
    Event, EventSink, FinishReason, GenerateParams, Lane, Proposer, Request, TokenLogprob, Usage,
};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::sync::watch;

/// Feeds the request's channel; reports itself closed when the receiver is gone or the
/// request was cancelled (so the engine cancels it and frees its KV blocks).
struct ChannelSink(UnboundedSender<Event>, watch::Receiver<bool>);

impl EventSink for ChannelSink {
    fn send(&mut self, event: Event) -> bool {
        !*self.1.borrow() && self.0.send(event).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.0.is_closed() || *self.1.borrow()
    }
}

/// A generation request, resolved from either API.
pub struct GenRequest {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    pub lane: Lane,
    pub n: usize,
    pub logprobs: Option<usize>,
    /// Drafts tokens for speculative decoding ([`crate::spec::proposer`]).
    pub proposer: Option<Box<dyn Proposer>>,
    /// Logits processors per completion (an output constraint), if any.
    pub processors: Option<mica::engine::ProcessorFactory>,
    /// The request's LoRA adapters ([`crate::lora`]).
    pub lora: Option<Arc<mica::models::lora::LoraSelection>>,
}

/// A submitted request: its events, and the model it runs on (held so the model is not
/// unloaded under it).
pub struct Running {
    pub rx: UnboundedReceiver<Event>,
    pub loaded: Arc<Loaded>,
    pub started: Instant,
    pub prompt_tokens: usize,
    /// Completions requested.
    pub n: usize,
    /// The request's record, reported when the generation ends ([`crate::reqlog`]).
    pub log: Option<RequestLog>,
    /// Fires when the request is cancelled through the live table.
    pub cancel: watch::Receiver<bool>,
}

impl Running {
    /// The next engine event (noted in the request's record).
    pub async fn recv(&mut self) -> Option<Event> {
        let ev = self.rx.recv().await;
        if let (Some(ev), Some(log)) = (&ev, &mut self.log) {
            log.see(ev);
        }
        ev
    }
}

pub fn start(loaded: Arc<Loaded>, req: GenRequest) -> Result<Running, ServerError> {
    let (tx, rx) = unbounded_channel();
    let prompt_tokens = req.prompt.len();
    let n = req.n;
    let (cancel_tx, cancel) = watch::channel(false);
    let log = RequestLog::start(&loaded.name, req.lane, n, prompt_tokens, cancel_tx, || {
        // Special tokens as text: the prompt as the model saw it.
        loaded
            .model
            .tokenizer
            .decode(&req.prompt)
            .unwrap_or_else(|e| format!("<prompt not decodable: {e}>"))
    });
    loaded.engine.submit(Request {
        prompt: req.prompt,
        params: req.params,
        lane: req.lane,
        n: req.n,
        logprobs: req.logprobs,
        sink: Box::new(ChannelSink(tx, cancel.clone())),
        processors: req.processors,
        proposer: req.proposer,
        lora: req.lora,
    })?;
    Ok(Running {
        rx,
        loaded,
        started: Instant::now(),
        prompt_tokens,
        n,
        log,
        cancel,
    })
}

/// One finished completion.
#[derive(Default, Debug)]
pub struct ChoiceOut {
    pub text: String,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Option<FinishReason>,
}

pub struct Collected {
    pub choices: Vec<ChoiceOut>,
    pub usage: Usage,
    pub first_token: Option<Instant>,
}

/// Waits for every completion of `running`.
pub async fn collect(mut running: Running) -> Result<Collected, ServerError> {
    let n = running.n;
    let mut choices: Vec<ChoiceOut> = (0..n).map(|_| ChoiceOut::default()).collect();
    let mut first_token = None;
    let mut cancel = running.cancel.clone();
    loop {
        let ev = tokio::select! {
            biased;
            ev = running.recv() => ev,
            () = fired(&mut cancel) => None,
        };
        // The engine drops a cancelled request's channel, so a closed channel after a
        // cancel is the cancel too, whichever of the two was seen first.
        if ev.is_none() && *cancel.borrow() {
            // Cancelled: the unfinished completions end with `abort`.
            let generated = choices.iter().map(|c| c.tokens.len()).sum();
            let progress = Progress {
                done: choices.iter().map(|c| c.finish.is_some()).collect(),
                completion_tokens: generated,
            };
            for ev in progress.ending(running.prompt_tokens) {
                if let Some(log) = &mut running.log {
                    log.see(&ev);
                }
                match ev {
                    Event::Done { index, finish, .. } => choices[index].finish = Some(finish),
                    Event::Finished { usage } => {
                        return Ok(Collected {
                            choices,
                            usage,
                            first_token,
                        });
                    }
                    _ => {}
                }
            }
            return Err(ServerError::EngineStopped);
        }
        let Some(ev) = ev else { break };
        match ev {
            Event::Token {
                index,
                token,
                text,
                logprob,
            } => {
                first_token.get_or_insert_with(Instant::now);
                if let Some(c) = choices.get_mut(index) {
                    c.tokens.push(token);
                    c.text.push_str(&text);
                    c.logprobs.extend(logprob);
                }
            }
            Event::Done {
                index,
                finish,
                text,
            } => {
                if let Some(c) = choices.get_mut(index) {
                    c.text.push_str(&text);
                    c.finish = Some(finish);
                }
            }
            Event::Finished { usage } => {
                return Ok(Collected {
                    choices,
                    usage,
                    first_token,
                });
            }
            Event::Error(e) => return Err(ServerError::Generation(e.to_string())),
        }
    }
    Err(ServerError::EngineStopped)
}

/// Turns engine events into the bytes of a streaming response.
pub trait StreamFormat: Send + 'static {
    /// Text to send for one event (may be empty).
    fn on_event(&mut self, running: &Running, event: Event) -> String;
    /// Text to send after the last event (or when the engine went away).
    fn finish(&mut self, running: &Running) -> String;
}

/// What a stream has sent so far: enough to end it on the engine's behalf.
struct Progress {
    done: Vec<bool>,
    completion_tokens: usize,
}

impl Progress {
    fn see(&mut self, ev: &Event) {
        match ev {
            Event::Token { .. } => self.completion_tokens += 1,
            Event::Done { index, .. } => {
                if let Some(d) = self.done.get_mut(*index) {
                    *d = true;
                }
            }
            _ => {}
        }
    }

    /// The events that end every unfinished completion, then the request.
    fn ending(&self, prompt_tokens: usize) -> Vec<Event> {
        let mut out: Vec<Event> = (0..self.done.len())
            .filter(|&i| !self.done[i])
            .map(|index| Event::Done {
                index,
                finish: FinishReason::Cancelled,
                text: String::new(),
            })
            .collect();
        out.push(Event::Finished {
            usage: Usage {
                prompt_tokens,
                cached_tokens: 0,
                completion_tokens: self.completion_tokens,
                ..Usage::default()
            },
        });
        out
    }
}

/// A response body streaming `running` through `fmt`. When `abort` fires, the stream ends
/// at once with a final event for every unfinished completion (see the module docs).
pub fn stream_body<F: StreamFormat>(
    running: Running,
    fmt: F,
    abort: watch::Receiver<bool>,
) -> Body {
    let progress = Progress {
        done: vec![false; running.n],
        completion_tokens: 0,
    };
    let state = Some((running, fmt, progress, abort));
    let stream = futures_util::stream::unfold(state, |state| async move {
        let (mut running, mut fmt, mut progress, mut abort) = state?;
        let mut cancel = running.cancel.clone();
        loop {
            let ev = tokio::select! {
                biased;
                ev = running.recv() => ev,
                () = async {
                    tokio::select! {
                        () = fired(&mut abort) => {}
                        () = fired(&mut cancel) => {}
                    }
                } => None,
            };
            // A cancelled request's channel is dropped by the engine: a closed channel after
            // a cancel or an abort ends the stream the same way, whichever came first.
            if ev.is_none() && (*cancel.borrow() || *abort.borrow()) {
                let mut out = String::new();
                for ev in progress.ending(running.prompt_tokens) {
                    if let Some(log) = &mut running.log {
                        log.see(&ev);
                    }
                    out.push_str(&fmt.on_event(&running, ev));
                }
                out.push_str(&fmt.finish(&running));
                return Some((Ok::<_, std::convert::Infallible>(Bytes::from(out)), None));
            }
            let Some(ev) = ev else {
                let tail = fmt.finish(&running);
                return Some((Ok(Bytes::from(tail)), None));
            };
            progress.see(&ev);
            let last = matches!(ev, Event::Finished { .. } | Event::Error(_));
            let mut out = fmt.on_event(&running, ev);
            if last {
                out.push_str(&fmt.finish(&running));
                return Some((Ok(Bytes::from(out)), None));
            }
            if !out.is_empty() {
                return Some((Ok(Bytes::from(out)), Some((running, fmt, progress, abort))));
            }
        }
    });
    Body::from_stream(stream)
}

/// The finish reason on the wire (OpenAI's `finish_reason`, Ollama's `done_reason`):
/// `length` for the token limit or a full context, `abort` for a request the server ended
/// (shutdown), `stop` otherwise (the end of text, a stop string, or an output constraint
/// that allows nothing more).
pub fn finish_reason(f: Option<FinishReason>) -> &'static str {
    match f {
        Some(FinishReason::Length | FinishReason::Context) => "length",
        Some(FinishReason::Cancelled) => "abort",
        _ => "stop",
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// An RFC 3339 UTC timestamp (as Ollama's `created_at`).
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_formats_known_instants() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(951_782_400);
        assert_eq!(super::rfc3339(t), "2000-02-29T00:00:00.000000000Z");
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        assert_eq!(super::rfc3339(t), "2023-11-14T22:13:20.000000000Z");
    }
}
