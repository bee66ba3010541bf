//! Counters and histograms the engine keeps while serving, readable from any thread (atomics
//! only, no lock on the step loop's path), and their Prometheus text exposition.

use crate::scheduler::Lane;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How a request ended, as counted in `mica_requests_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestStatus {
    Ok,
    Cancelled,
    Error,
    /// Refused at submission (queue full, bad parameters, prompt too long).
    Rejected,
}

impl RequestStatus {
    pub const ALL: [RequestStatus; 4] = [
        RequestStatus::Ok,
        RequestStatus::Cancelled,
        RequestStatus::Error,
        RequestStatus::Rejected,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            RequestStatus::Ok => "ok",
            RequestStatus::Cancelled => "cancelled",
            RequestStatus::Error => "error",
            RequestStatus::Rejected => "rejected",
        }
    }
}

/// A cumulative histogram of durations in seconds.
pub struct Histogram {
    bounds: &'static [f64],
    /// `[bounds.len() + 1]`, the last one for +Inf.
    counts: Vec<AtomicU64>,
    sum_us: AtomicU64,
}

const LATENCY_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

impl Histogram {
    fn latency() -> Histogram {
        Histogram {
            bounds: LATENCY_BOUNDS,
            counts: (0..=LATENCY_BOUNDS.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            sum_us: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, seconds: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_us.fetch_add((seconds * 1e6) as u64, Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Relaxed)).sum()
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cum = 0;
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, c) in self.counts.iter().enumerate() {
            cum += c.load(Relaxed);
            let le = self
                .bounds
                .get(i)
                .map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cum}");
        }
        let sum = self.sum_us.load(Relaxed) as f64 / 1e6;
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {cum}");
    }
}

/// Everything `/metrics` reports about one engine.
pub struct EngineMetrics {
    /// `[lane][status]`
    requests: [[AtomicU64; 4]; 3],
    /// Waiting sequences per lane (set each step).
    pub waiting: [AtomicU64; 3],
    pub running: AtomicU64,
    /// Time to first token, per lane.
    pub ttft: [Histogram; 3],
    /// Time per output token after the first.
    pub tpot: Histogram,
    pub prompt_tokens: AtomicU64,
    pub cached_prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Generated tokens per second over the last few seconds, as f64 bits.
    tokens_per_s: AtomicU64,
    pub steps: AtomicU64,
    /// Steps abandoned mid-way for a more urgent request (their work is redone).
    pub abandoned_steps: AtomicU64,
    pub kv_blocks_total: AtomicU64,
    pub kv_blocks_used: AtomicU64,
    pub kv_blocks_cached: AtomicU64,
    /// Hybrid models: recurrent-state checkpoints the prefix cache may hold.
    pub state_checkpoints_total: AtomicU64,
    /// Hybrid models: of those, checkpoints holding a cached prefix's state.
    pub state_checkpoints_cached: AtomicU64,
    pub prefix_queried_tokens: AtomicU64,
    pub prefix_hit_tokens: AtomicU64,
    pub preemptions: AtomicU64,
    /// Drafted tokens verified (multi-token steps of requests with a proposer).
    pub draft_tokens: AtomicU64,
    /// Of those, tokens the model agreed with.
    pub accepted_draft_tokens: AtomicU64,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        let z = || AtomicU64::new(0);
        EngineMetrics {
            requests: std::array::from_fn(|_| std::array::from_fn(|_| z())),
            waiting: std::array::from_fn(|_| z()),
            running: z(),
            ttft: std::array::from_fn(|_| Histogram::latency()),
            tpot: Histogram::latency(),
            prompt_tokens: z(),
            cached_prompt_tokens: z(),
            generated_tokens: z(),
            tokens_per_s: z(),
            steps: z(),
            abandoned_steps: z(),
            kv_blocks_total: z(),
            kv_blocks_used: z(),
            kv_blocks_cached: z(),
            state_checkpoints_total: z(),
            state_checkpoints_cached: z(),
            prefix_queried_tokens: z(),
            prefix_hit_tokens: z(),
            preemptions: z(),
            draft_tokens: z(),
            accepted_draft_tokens: z(),
        }
    }
}

impl EngineMetrics {
    pub fn count_request(&self, lane: Lane, status: RequestStatus) {
        let s = RequestStatus::ALL
            .iter()
            .position(|&x| x == status)
            .unwrap_or(0);
        self.requests[lane.index()][s].fetch_add(1, Relaxed);
    }

    pub fn requests(&self, lane: Lane, status: RequestStatus) -> u64 {
        let s = RequestStatus::ALL
            .iter()
            .position(|&x| x == status)
            .unwrap_or(0);
        self.requests[lane.index()][s].load(Relaxed)
    }

    pub fn set_tokens_per_s(&self, v: f64) {
        self.tokens_per_s.store(v.to_bits(), Relaxed);
    }

    pub fn tokens_per_s(&self) -> f64 {
        f64::from_bits(self.tokens_per_s.load(Relaxed))
    }

    /// Prometheus text exposition; every name carries `model="<model>"`.
    pub fn render(&self, model: &str, out: &mut String) {
        let m = format!(
            "model=\"{}\"",
            model.replace('\\', "\\\\").replace('"', "\\\"")
        );
        let g = |out: &mut String, name: &str, help: &str, kind: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        g(
            out,
            "mica_requests_total",
            "Requests by lane and outcome.",
            "counter",
        );
        for lane in Lane::ALL {
            for st in RequestStatus::ALL {
                let _ = writeln!(
                    out,
                    "mica_requests_total{{{m},lane=\"{}\",status=\"{}\"}} {}",
                    lane.as_str(),
                    st.as_str(),
                    self.requests(lane, st)
                );
            }
        }
        g(
            out,
            "mica_queue_depth",
            "Waiting sequences per lane.",
            "gauge",
        );
        for lane in Lane::ALL {
            let _ = writeln!(
                out,
                "mica_queue_depth{{{m},lane=\"{}\"}} {}",
                lane.as_str(),
                self.waiting[lane.index()].load(Relaxed)
            );
        }
        let simple = [
            (
                "mica_running_sequences",
                "Sequences in the running batch.",
                "gauge",
                self.running.load(Relaxed),
            ),
            (
                "mica_prompt_tokens_total",
                "Prompt tokens received.",
                "counter",
                self.prompt_tokens.load(Relaxed),
            ),
            (
                "mica_cached_prompt_tokens_total",
                "Prompt tokens served from the prefix cache.",
                "counter",
                self.cached_prompt_tokens.load(Relaxed),
            ),
            (
                "mica_generated_tokens_total",
                "Tokens generated.",
                "counter",
                self.generated_tokens.load(Relaxed),
            ),
            (
                "mica_steps_total",
                "Engine steps (forward passes).",
                "counter",
                self.steps.load(Relaxed),
            ),
            (
                "mica_abandoned_steps_total",
                "Steps abandoned mid-way for a request of a higher lane (work redone later).",
                "counter",
                self.abandoned_steps.load(Relaxed),
            ),
            (
                "mica_kv_blocks_total",
                "KV cache blocks in the pool.",
                "gauge",
                self.kv_blocks_total.load(Relaxed),
            ),
            (
                "mica_kv_blocks_used",
                "KV cache blocks held by sequences.",
                "gauge",
                self.kv_blocks_used.load(Relaxed),
            ),
            (
                "mica_kv_blocks_free",
                "KV cache blocks free (including unreferenced cached ones).",
                "gauge",
                self.kv_blocks_total
                    .load(Relaxed)
                    .saturating_sub(self.kv_blocks_used.load(Relaxed)),
            ),
            (
                "mica_kv_blocks_cached",
                "KV cache blocks in the prefix cache.",
                "gauge",
                self.kv_blocks_cached.load(Relaxed),
            ),
            (
                "mica_state_checkpoints_total",
                "Recurrent-state checkpoints the prefix cache may hold (hybrid models).",
                "gauge",
                self.state_checkpoints_total.load(Relaxed),
            ),
            (
                "mica_state_checkpoints_cached",
                "Recurrent-state checkpoints holding a cached prefix's state (hybrid models).",
                "gauge",
                self.state_checkpoints_cached.load(Relaxed),
            ),
            (
                "mica_prefix_cache_queried_tokens_total",
                "Prompt tokens looked up in the prefix cache.",
                "counter",
                self.prefix_queried_tokens.load(Relaxed),
            ),
            (
                "mica_prefix_cache_hit_tokens_total",
                "Prompt tokens found in the prefix cache.",
                "counter",
                self.prefix_hit_tokens.load(Relaxed),
            ),
            (
                "mica_preemptions_total",
                "Sequences preempted (KV freed, recomputed later).",
                "counter",
                self.preemptions.load(Relaxed),
            ),
            (
                "mica_draft_tokens_total",
                "Drafted tokens verified in multi-token steps.",
                "counter",
                self.draft_tokens.load(Relaxed),
            ),
            (
                "mica_accepted_draft_tokens_total",
                "Drafted tokens the model agreed with.",
                "counter",
                self.accepted_draft_tokens.load(Relaxed),
            ),
        ];
        for (name, help, kind, v) in simple {
            g(out, name, help, kind);
            let _ = writeln!(out, "{name}{{{m}}} {v}");
        }
        let (q, h) = (
            self.prefix_queried_tokens.load(Relaxed),
            self.prefix_hit_tokens.load(Relaxed),
        );
        let rate = if q == 0 { 0.0 } else { h as f64 / q as f64 };
        g(
            out,
            "mica_prefix_cache_hit_rate",
            "Share of looked-up prompt tokens found cached.",
            "gauge",
        );
        let _ = writeln!(out, "mica_prefix_cache_hit_rate{{{m}}} {rate}");
        g(
            out,
            "mica_generation_tokens_per_second",
            "Generated tokens per second (recent).",
            "gauge",
        );
        let _ = writeln!(
            out,
            "mica_generation_tokens_per_second{{{m}}} {}",
            self.tokens_per_s()
        );
        g(
            out,
            "mica_time_to_first_token_seconds",
            "Arrival to first token, per lane.",
            "histogram",
        );
        for lane in Lane::ALL {
            let labels = format!("{m},lane=\"{}\"", lane.as_str());
            self.ttft[lane.index()].render(out, "mica_time_to_first_token_seconds", &labels);
        }
        g(
            out,
            "mica_time_per_output_token_seconds",
            "Time between output tokens.",
            "histogram",
        );
        self.tpot
            .render(out, "mica_time_per_output_token_seconds", &m);
    }
}
