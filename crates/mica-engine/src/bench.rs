//! Speed measurement of a loaded model the way llama.cpp's `llama-bench` measures it, so the
//! two tools' numbers can be set side by side. `mica bench` prints what this module times;
//! the bindings and scripts can time the same way.
//!
//! Reference: llama.cpp `tools/llama-bench/llama-bench.cpp` (`test_prompt`, `test_gen`).
//! What is mirrored, and why:
//! - **pp N**: from an empty cache, one forward pass over N arbitrary tokens (BOS first when
//!   the model adds one, then pseudo-random ids), in micro-batches of [`PROMPT_CHUNK`] tokens
//!   (llama.cpp's `n_ubatch`), logits for the last token only. Token ids do not change the
//!   work of a dense model, so random ids time the same kernels as real text.
//! - **tg N**: from an empty cache, N forward passes of one token each (BOS first, then
//!   random ids), logits every step. Sampling is not timed (llama-bench does not sample).
//! - **@ dD** (`n_depth`, llama-bench's `-d`): the test runs after D tokens already in the
//!   cache (a prompt of D tokens, not timed); between repetitions the cache is cut back to
//!   those D positions (a hybrid model, whose recurrent state cannot be cut back, refills
//!   them), as llama-bench restores its saved state.
//! - One warm-up run before the timed ones (a whole prompt for pp; one token for tg, as
//!   llama-bench), then the timed repetitions, each starting from an empty cache.
//! - Speed per repetition is `n_tokens / seconds`; [`Stats`] gives the mean and the sample
//!   standard deviation of those speeds (not the speed of the mean time), as llama-bench.

use crate::generate::PROMPT_CHUNK;
use mica_kernels::ThreadPool;
use mica_models::{Batch, KvCache, LoadedModel, Result, Workspace};
use std::path::Path;
use std::time::Instant;

/// One test: a prompt of `n_prompt` tokens or a generation of `n_gen` (one of them is 0, as
/// in llama-bench; a test with both times the prompt only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BenchTest {
    pub n_prompt: usize,
    pub n_gen: usize,
    /// Tokens in the cache before the timed part (0: an empty cache).
    pub n_depth: usize,
}

impl BenchTest {
    /// llama-bench's test name: `pp512`, `tg128`, `tg128 @ d4096`.
    pub fn name(&self) -> String {
        let base = if self.n_gen == 0 {
            format!("pp{}", self.n_prompt)
        } else {
            format!("tg{}", self.n_gen)
        };
        match self.n_depth {
            0 => base,
            d => format!("{base} @ d{d}"),
        }
    }

    /// Tokens one repetition processes (the numerator of its speed).
    pub fn n_tokens(&self) -> usize {
        self.n_prompt + self.n_gen
    }
}

/// Runs one test: a warm-up, then `reps` timed runs from an empty cache. Returns the time of
/// each run in nanoseconds.
pub fn time_test(
    lm: &LoadedModel,
    pool: &ThreadPool,
    test: BenchTest,
    reps: usize,
) -> Result<Vec<u64>> {
    let model = &lm.model;
    let depth = test.n_depth;
    // A cache just large enough, as llama-bench sizes its context (depth + n_prompt + n_gen).
    let mut kv = KvCache::new(&model.config, depth + test.n_prompt + test.n_gen, 1);
    let mut ws = Workspace::default();
    let mut tokens = TokenSource::new(lm);
    let rewinds = !model.config.has_recurrent_state();
    // The untimed part: `depth` tokens in the cache, from the previous run's when it can be
    // cut back to them.
    let fill = |kv: &mut KvCache, ws: &mut Workspace, tokens: &mut TokenSource| {
        if rewinds && kv.seq_len(0) >= depth && depth > 0 {
            kv.truncate(0, depth);
            return Ok(());
        }
        kv.clear(0);
        prompt(lm, pool, kv, ws, tokens, 0, depth)
    };
    let once = |kv: &mut KvCache,
                ws: &mut Workspace,
                tokens: &mut TokenSource,
                gen_len: usize|
     -> Result<()> {
        if test.n_prompt > 0 {
            prompt(lm, pool, kv, ws, tokens, depth, test.n_prompt)
        } else {
            generate(lm, pool, kv, ws, tokens, depth, gen_len)
        }
    };
    // Warm-up: touches the weights and grows the buffers (one token for tg, as llama-bench).
    fill(&mut kv, &mut ws, &mut tokens)?;
    once(&mut kv, &mut ws, &mut tokens, 1)?;
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        fill(&mut kv, &mut ws, &mut tokens)?;
        let t0 = Instant::now();
        once(&mut kv, &mut ws, &mut tokens, test.n_gen)?;
        samples.push(t0.elapsed().as_nanos() as u64);
    }
    Ok(samples)
}

/// pp: `n` tokens through the model from position `start` in micro-batches, logits for the
/// last token only.
fn prompt(
    lm: &LoadedModel,
    pool: &ThreadPool,
    kv: &mut KvCache,
    ws: &mut Workspace,
    tokens: &mut TokenSource,
    start: usize,
    n: usize,
) -> Result<()> {
    let ids: Vec<u32> = (0..n).map(|i| tokens.next(start + i == 0)).collect();
    let mut done = 0;
    for chunk in ids.chunks(PROMPT_CHUNK) {
        // Logits for the last token of the whole prompt only.
        let mut batch = Batch::for_sequence(chunk, start + done, 0, false);
        if done + chunk.len() < n {
            batch.logits.fill(false);
        }
        lm.model.forward(pool, &batch, kv, ws)?;
        done += chunk.len();
    }
    Ok(())
}

/// tg: `n` single-token forward passes from position `start`, each with logits.
fn generate(
    lm: &LoadedModel,
    pool: &ThreadPool,
    kv: &mut KvCache,
    ws: &mut Workspace,
    tokens: &mut TokenSource,
    start: usize,
    n: usize,
) -> Result<()> {
    let mut batch = Batch::new();
    for pos in start..start + n {
        batch.clear();
        batch.push(tokens.next(pos == 0), pos, 0, true);
        lm.model.forward(pool, &batch, kv, ws)?;
    }
    Ok(())
}

/// Token ids as llama-bench picks them: BOS first when the model adds one, otherwise
/// pseudo-random ids over the vocabulary (xorshift64*, fixed seed: runs repeat exactly).
struct TokenSource {
    bos: Option<u32>,
    n_vocab: u64,
    state: u64,
}

impl TokenSource {
    fn new(lm: &LoadedModel) -> TokenSource {
        let t = &lm.tokenizer;
        TokenSource {
            bos: t.bos().filter(|_| t.add_bos()),
            n_vocab: t.vocab_size().min(lm.model.config.n_vocab).max(1) as u64,
            state: 0x9E37_79B9_7F4A_7C15,
        }
    }

    fn next(&mut self, first: bool) -> u32 {
        if first && let Some(b) = self.bos {
            return b;
        }
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        (self.state.wrapping_mul(0x2545_F491_4F6C_DD1D) % self.n_vocab) as u32
    }
}

/// Mean and sample standard deviation of a test's repetitions, in time and in speed.
#[derive(Clone, Debug, PartialEq)]
pub struct Stats {
    pub avg_ns: f64,
    pub stddev_ns: f64,
    /// Tokens per second of each repetition.
    pub samples_ts: Vec<f64>,
    pub avg_ts: f64,
    pub stddev_ts: f64,
}

impl Stats {
    /// Statistics of `samples_ns` (one entry per repetition) for a test of `n_tokens` tokens.
    pub fn of(samples_ns: &[u64], n_tokens: usize) -> Stats {
        let ns: Vec<f64> = samples_ns.iter().map(|&s| s as f64).collect();
        let samples_ts: Vec<f64> = ns
            .iter()
            .map(|&s| 1e9 * n_tokens as f64 / s.max(1.0))
            .collect();
        Stats {
            avg_ns: mean(&ns),
            stddev_ns: stdev(&ns),
            avg_ts: mean(&samples_ts),
            stddev_ts: stdev(&samples_ts),
            samples_ts,
        }
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

/// Sample standard deviation (n - 1), 0 for fewer than two samples, as llama-bench.
fn stdev(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let m = mean(v);
    let ss: f64 = v.iter().map(|x| (x - m) * (x - m)).sum();
    (ss / (v.len() - 1) as f64).sqrt()
}

/// What a benchmark's records say about the model.
#[derive(Clone, Debug)]
pub struct ModelSummary {
    pub filename: String,
    /// llama.cpp's `llama_model_desc` layout: `{arch} {size} {file type}`.
    pub desc: String,
    /// Bytes of all tensors (llama.cpp's `llama_model_size`).
    pub size: u64,
    /// Elements of all tensors (llama.cpp's `llama_model_n_params`).
    pub n_params: u64,
    /// The KV cache's key and value types (f32 for float32 checkpoints, f16 by default).
    pub type_k: &'static str,
    pub type_v: &'static str,
    /// Bytes one cached position takes in the KV pool (keys and values of every layer).
    pub kv_bytes_per_token: usize,
}

impl ModelSummary {
    pub fn of(path: &Path, lm: &LoadedModel) -> ModelSummary {
        // A GGUF file describes itself; a Hugging Face folder is summed from the model.
        let (size, n_params, ftype) = match &lm.model.file {
            Some(g) => (
                g.tensors().iter().map(|t| t.n_bytes).sum(),
                g.tensors().iter().map(|t| t.n_elements()).sum(),
                g.get_u32("general.file_type").map_or_else(
                    || "unknown file type".to_string(),
                    mica_formats::gguf::file_type_name,
                ),
            ),
            None => (
                lm.model.weight_bytes() as u64,
                lm.model.n_params() as u64,
                "safetensors".to_string(),
            ),
        };
        let label = if n_params < 1_000_000_000 {
            format!("{:.0}M", n_params as f64 / 1e6)
        } else {
            format!("{:.1}B", n_params as f64 / 1e9)
        };
        ModelSummary {
            type_k: lm.model.config.cache_types().k.name(),
            type_v: lm.model.config.cache_types().v.name(),
            kv_bytes_per_token: KvCache::bytes_per_block(&lm.model.config)
                / mica_models::kv_cache::BLOCK_SIZE,
            filename: path.display().to_string(),
            desc: format!("{} {label} {ftype}", lm.model.config.arch),
            size,
            n_params,
        }
    }
}

/// The CPU's model name, as llama.cpp's CPU backend describes itself.
pub fn cpu_info() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "CPU".to_string())
}

/// Peak resident set size of this process (`VmHWM`), where the OS reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_match_llama_bench_definitions() {
        // Two repetitions of 100 tokens: 1 s and 0.5 s -> 100 and 200 tokens/s.
        let s = Stats::of(&[1_000_000_000, 500_000_000], 100);
        assert_eq!(s.samples_ts, vec![100.0, 200.0]);
        assert_eq!(s.avg_ts, 150.0);
        // Sample (n - 1) deviation: sqrt(((50^2) * 2) / 1).
        assert!((s.stddev_ts - 70.710_678_118_654_76).abs() < 1e-9);
        assert_eq!(s.avg_ns, 750_000_000.0);
        // One repetition has no spread.
        assert_eq!(Stats::of(&[10], 1).stddev_ts, 0.0);
    }

    #[test]
    fn sample_stdev() {
        assert_eq!(stdev(&[5.0]), 0.0);
        assert!((stdev(&[1.0, 2.0, 3.0, 4.0]) - 1.290_994_4).abs() < 1e-6);
    }

    #[test]
    fn test_names() {
        let pp = BenchTest {
            n_prompt: 512,
            n_gen: 0,
            n_depth: 0,
        };
        let tg = BenchTest {
            n_prompt: 0,
            n_gen: 128,
            n_depth: 0,
        };
        assert_eq!((pp.name(), pp.n_tokens()), ("pp512".to_string(), 512));
        assert_eq!((tg.name(), tg.n_tokens()), ("tg128".to_string(), 128));
        let deep = BenchTest {
            n_depth: 4096,
            ..tg
        };
        assert_eq!(
            (deep.name(), deep.n_tokens()),
            ("tg128 @ d4096".to_string(), 128)
        );
    }
}
