//! The bridge between HTTP handlers and the engine: submitting a request with a sink that
//! feeds a tokio channel, collecting a whole answer, and streaming one as a response body.
//!
//! Cancellation: the sink reports itself closed as soon as the receiving half is dropped —
//! when the client disconnects, hyper drops the response body (streaming) or the handler's
//! future (non-streaming), which drops the receiver — and the engine then cancels the
//! request and frees its KV blocks at its next step.

use crate::error::ApiError;
use crate::state::Loaded;
use axum::body::{Body, Bytes};
use mica_engine::{
    Event, EventSink, FinishReason, GenerateParams, Lane, Request, TokenLogprob, Usage,
};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

struct ChannelSink(UnboundedSender<Event>);

impl EventSink for ChannelSink {
    fn send(&mut self, event: Event) -> bool {
        self.0.send(event).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// A generation request, resolved from either API.
pub struct GenRequest {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    pub lane: Lane,
    pub n: usize,
    pub logprobs: Option<usize>,
}

/// A submitted request: its events, and the model it runs on (held so the model is not
/// unloaded under it).
pub struct Running {
    pub rx: UnboundedReceiver<Event>,
    pub loaded: Arc<Loaded>,
    pub started: Instant,
    pub prompt_tokens: usize,
}

pub fn start(loaded: Arc<Loaded>, req: GenRequest) -> Result<Running, ApiError> {
    let (tx, rx) = unbounded_channel();
    let prompt_tokens = req.prompt.len();
    loaded.engine.submit(Request {
        prompt: req.prompt,
        params: req.params,
        lane: req.lane,
        n: req.n,
        logprobs: req.logprobs,
        sink: Box::new(ChannelSink(tx)),
        processors: None,
        proposer: None,
    })?;
    Ok(Running {
        rx,
        loaded,
        started: Instant::now(),
        prompt_tokens,
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
pub async fn collect(mut running: Running, n: usize) -> Result<Collected, ApiError> {
    let mut choices: Vec<ChoiceOut> = (0..n).map(|_| ChoiceOut::default()).collect();
    let mut first_token = None;
    while let Some(ev) = running.rx.recv().await {
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
            Event::Error(e) => return Err(ApiError::internal(e.to_string())),
        }
    }
    Err(ApiError::unavailable(
        "the engine stopped before the answer was complete",
        5,
    ))
}

/// Turns engine events into the bytes of a streaming response.
pub trait StreamFormat: Send + 'static {
    /// Text to send for one event (may be empty).
    fn on_event(&mut self, running: &Running, event: Event) -> String;
    /// Text to send after the last event (or when the engine went away).
    fn finish(&mut self, running: &Running) -> String;
}

/// A response body streaming `running` through `fmt`.
pub fn stream_body<F: StreamFormat>(running: Running, fmt: F) -> Body {
    let stream = futures_util::stream::unfold(Some((running, fmt)), |state| async move {
        let (mut running, mut fmt) = state?;
        loop {
            let Some(ev) = running.rx.recv().await else {
                let tail = fmt.finish(&running);
                return Some((Ok::<_, std::convert::Infallible>(Bytes::from(tail)), None));
            };
            let last = matches!(ev, Event::Finished { .. } | Event::Error(_));
            let mut out = fmt.on_event(&running, ev);
            if last {
                out.push_str(&fmt.finish(&running));
                return Some((Ok(Bytes::from(out)), None));
            }
            if !out.is_empty() {
                return Some((Ok(Bytes::from(out)), Some((running, fmt))));
            }
        }
    });
    Body::from_stream(stream)
}

/// OpenAI's `finish_reason`.
pub fn openai_finish(f: Option<FinishReason>) -> &'static str {
    match f {
        Some(FinishReason::Length | FinishReason::Context) => "length",
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
