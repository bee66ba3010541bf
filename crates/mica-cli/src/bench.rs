//! `mica bench`: prompt-processing and generation speed, measured the way llama.cpp's
//! `llama-bench` measures them (the timing loop is `mica::engine::bench`), printed as its
//! markdown table or its JSON records so the two tools' numbers can be set side by side.
//!
//! - **copy N** / **copy N+ngram** (`--copy N`, mica's own): speculative decoding's test,
//!   N greedy tokens after a fixed code-editing prompt, plain and with n-gram lookup (see
//!   [`copy`]); speed is N over the generation's time, `n_depth` the prompt's length.
//!
//! Peak resident memory is the process's high-water mark (`VmHWM`), which includes the
//! pages of the memory-mapped model that were touched.

mod copy;

use crate::budget::{self, BudgetArgs, InUse, ResidentCheck, Sizing};
use crate::cache_args::CacheArgs;
use crate::lora_args::LoraArgs;
use anyhow::{Context, Result, bail};
use clap::Args;
use mica::engine::bench::{BenchTest, ModelSummary, Stats, cpu_info, peak_rss_bytes, time_test};
use mica::engine::generate::PROMPT_CHUNK;
use mica::kernels::ThreadPool;
use mica::models::LoadedModel;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Model: a GGUF file or a store name (see `mica list`).
    #[arg(short = 'm', long = "model")]
    pub model: String,
    /// Prompt lengths to time, comma-separated (0 = no prompt test).
    #[arg(short = 'p', long = "n-prompt", default_value = "512")]
    pub n_prompt: String,
    /// Generation lengths to time, comma-separated (0 = no generation test).
    #[arg(short = 'n', long = "n-gen", default_value = "128")]
    pub n_gen: String,
    /// Tokens already in the cache before each prompt or generation test (llama-bench's
    /// `-d`), comma-separated; the test is named `tg128 @ d4096` (not timed: filling them).
    #[arg(short = 'd', long = "n-depth", default_value = "0")]
    pub n_depth: String,
    /// Thread counts, comma-separated (default: physical cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<String>,
    /// Timed repetitions of each test (after one warm-up run).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// Print a JSON array with one record per test (llama-bench's field names).
    #[arg(long = "json")]
    pub json: bool,
    /// Also draw the results as an SVG chart: tokens/s per test, a bar per thread count.
    #[arg(long = "chart", value_name = "FILE")]
    pub chart: Option<std::path::PathBuf>,
    /// Keep the weights in the file's layout instead of repacking them at load for faster
    /// products (same results; repacking reads the whole file up front).
    #[arg(long = "no-repack")]
    pub no_repack: bool,
    /// Time the model with these LoRA adapters applied unmerged (what they cost).
    #[command(flatten)]
    pub lora: LoraArgs,
    /// Time the model with these KV cache types (llama-bench's -ctk/-ctv).
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Speculative decoding's test: N greedy tokens after a code-editing prompt, timed
    /// plain (`copyN`) and with n-gram lookup (`copyN+ngram`); comma-separated lengths.
    #[arg(long = "copy")]
    pub copy: Option<String>,
    #[command(flatten)]
    pub budget: BudgetArgs,
}

/// The flags, resolved and checked.
struct Plan {
    model: PathBuf,
    threads: Vec<usize>,
    tests: Vec<TestSpec>,
    reps: usize,
    json: bool,
    chart: Option<PathBuf>,
    no_repack: bool,
    lora: LoraArgs,
    cache: CacheArgs,
    budget: BudgetArgs,
}

/// One test: a prompt of `n_prompt` tokens or a generation of `n_gen` (never both); `copy`
/// marks the speculative test's generation (with n-gram speculation when `Some(true)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TestSpec {
    n_prompt: usize,
    n_gen: usize,
    /// Tokens in the cache before the timed part.
    n_depth: usize,
    copy: Option<bool>,
}

impl TestSpec {
    /// Positions the test's sequence reaches (the copy test's prompt included).
    fn positions(&self, lm: &LoadedModel) -> usize {
        match self.copy {
            Some(_) => copy::prompt_ids(lm).map_or(0, |p| p.len()) + self.n_gen + 1,
            None => self.n_prompt + self.n_gen,
        }
    }

    /// llama-bench's test name: `pp512`, `tg128`; mica's `copy128`, `copy128+ngram`.
    fn name(self) -> String {
        match self.copy {
            Some(false) => format!("copy{}", self.n_gen),
            Some(true) => format!("copy{}+ngram", self.n_gen),
            None => self.timed().name(),
        }
    }

    /// The prompt or generation test `mica::engine::bench` times.
    fn timed(self) -> BenchTest {
        BenchTest {
            n_prompt: self.n_prompt,
            n_gen: self.n_gen,
            n_depth: self.n_depth,
        }
    }
}

/// Parses a comma-separated list of counts for flag `flag`.
fn parse_list(flag: &str, what: &str, s: &str) -> Result<Vec<usize>> {
    let items: Vec<&str> = s.split(',').map(str::trim).collect();
    if items.iter().all(|i| i.is_empty()) {
        bail!("{flag} needs at least one {what} (a comma-separated list, e.g. {flag} 128,512)");
    }
    items
        .iter()
        .map(|i| {
            i.parse::<usize>()
                .with_context(|| format!("{flag}: {i:?} is not a {what} (a non-negative integer)"))
        })
        .collect()
}

impl Plan {
    fn resolve(args: BenchArgs) -> Result<Plan> {
        let prompts = parse_list("-p", "token count", &args.n_prompt)?;
        let gens = parse_list("-n", "token count", &args.n_gen)?;
        let depths = parse_list("-d", "token count", &args.n_depth)?;
        let copies = match &args.copy {
            Some(c) => parse_list("--copy", "token count", c)?,
            None => Vec::new(),
        };
        let threads = match &args.threads {
            Some(t) => parse_list("-t", "thread count", t)?,
            None => vec![mica::kernels::pool::physical_cores()],
        };
        if threads.contains(&0) {
            bail!("-t: thread counts must be at least 1");
        }
        if args.reps == 0 {
            bail!("-r: at least one repetition is needed");
        }
        // As llama-bench: a zero length means "no such test".
        let plain = prompts
            .iter()
            .filter(|&&n| n > 0)
            .map(|&n| (n, 0))
            .chain(gens.iter().filter(|&&n| n > 0).map(|&n| (0, n)));
        let tests: Vec<TestSpec> = plain
            .flat_map(|(n_prompt, n_gen)| {
                depths.iter().map(move |&n_depth| TestSpec {
                    n_prompt,
                    n_gen,
                    n_depth,
                    copy: None,
                })
            })
            .chain(copies.iter().filter(|&&n| n > 0).flat_map(|&n| {
                [false, true].map(|spec| TestSpec {
                    n_prompt: 0,
                    n_gen: n,
                    n_depth: 0,
                    copy: Some(spec),
                })
            }))
            .collect();
        if tests.is_empty() {
            bail!("nothing to measure: every -p and -n length is 0");
        }
        Ok(Plan {
            model: crate::store::resolve_model(Some(&args.model), args.json)?,
            threads,
            tests,
            reps: args.reps,
            json: args.json,
            chart: args.chart,
            no_repack: args.no_repack,
            lora: args.lora.clone(),
            cache: args.cache.clone(),
            budget: args.budget.clone(),
        })
    }
}

/// One test's result as llama-bench's JSON printer writes it (same names, types and order),
/// followed by mica's own fields.
#[derive(Serialize)]
struct Record {
    build_commit: String,
    build_number: u64,
    cpu_info: String,
    gpu_info: String,
    backends: String,
    model_filename: String,
    model_type: String,
    model_size: u64,
    model_n_params: u64,
    n_batch: usize,
    n_ubatch: usize,
    n_threads: usize,
    type_k: String,
    type_v: String,
    n_gpu_layers: i64,
    /// llama.cpp's flash-attention setting as an integer; mica's attention is always the
    /// online-softmax (flash) kind.
    flash_attn: i64,
    n_prompt: usize,
    n_gen: usize,
    n_depth: usize,
    test_time: String,
    avg_ns: u64,
    stddev_ns: u64,
    avg_ts: f64,
    stddev_ts: f64,
    samples_ns: Vec<u64>,
    samples_ts: Vec<f64>,
    /// The SIMD kernel table in use (`avx512`, `avx2`, `scalar`).
    isa: String,
    /// The process's peak resident memory after this test; `null` where unknown.
    peak_rss_bytes: Option<u64>,
    /// Bytes one cached position takes in the KV pool, in the cache types above.
    kv_bytes_per_token: usize,
    /// The speculative test's proposer (`off`, `ngram`); absent for llama-bench's tests.
    #[serde(skip_serializing_if = "Option::is_none")]
    spec: Option<&'static str>,
    /// Drafted and accepted tokens per repetition (the speculative test).
    #[serde(skip_serializing_if = "Option::is_none")]
    draft_tokens: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    accepted_draft_tokens: Option<usize>,
}

pub fn bench(args: BenchArgs) -> Result<()> {
    let plan = Plan::resolve(args)?;
    let (mut lm, est) = budget::load(
        &plan.model,
        !plan.no_repack,
        &plan.budget,
        &plan.cache,
        |lm| {
            let n_ctx = plan
                .tests
                .iter()
                .map(|t| t.positions(lm))
                .max()
                .unwrap_or(1);
            Sizing::one_sequence(n_ctx, PROMPT_CHUNK)
        },
    )?;
    plan.lora.apply(&mut lm, plan.json)?;
    let mut resident = ResidentCheck::new(est);
    let info = ModelSummary::of(&plan.model, &lm);
    let isa = mica::kernels::simd::kernels().isa();
    let cpu = cpu_info();
    let mut table = if plan.json {
        None
    } else {
        Some(TablePrinter::start(&info)?)
    };
    let mut records = Vec::new();
    let mut names = Vec::new();
    for &n_threads in &plan.threads {
        let pool = ThreadPool::new(n_threads);
        for &spec in &plan.tests {
            let test_time = rfc3339_now();
            let what = || format!("{} on {n_threads} threads", spec.name());
            let rec = if let Some(ngram) = spec.copy {
                let prompt = copy::prompt_ids(&lm).with_context(what)?;
                let runs = (0..=plan.reps)
                    .map(|_| copy::run(&lm, n_threads, &prompt, spec.n_gen, ngram))
                    .collect::<Result<Vec<_>>>()
                    .with_context(what)?;
                // The first run is the warm-up.
                let samples_ns = runs[1..].iter().map(|r| r.gen_ns).collect();
                let mut rec = record(&info, &cpu, isa, n_threads, spec, test_time, samples_ns);
                rec.n_depth = prompt.len();
                rec.spec = Some(if ngram { "ngram" } else { "off" });
                rec.draft_tokens = Some(runs[1].draft_tokens);
                rec.accepted_draft_tokens = Some(runs[1].accepted_draft_tokens);
                rec
            } else {
                let samples_ns =
                    time_test(&lm, &pool, spec.timed(), plan.reps).with_context(what)?;
                record(&info, &cpu, isa, n_threads, spec, test_time, samples_ns)
            };
            // The peak so far covers the test's warm-up and timed runs.
            let in_use = InUse::one_sequence(&lm.model, spec.positions(&lm), PROMPT_CHUNK);
            resident.after_forward(peak_rss_bytes(), in_use);
            if let Some(t) = table.as_mut() {
                t.row(&rec, spec)?;
            }
            names.push(spec.name());
            records.push(rec);
        }
    }
    // Write errors (a closed pipe) end the command with an error, never a panic.
    let mut out = std::io::stdout().lock();
    if plan.json {
        serde_json::to_writer_pretty(&mut out, &records)?;
        writeln!(out)?;
    } else {
        let rss = peak_rss_bytes().map_or_else(
            || "n/a".to_string(),
            |b| format!("{:.2} MiB", b as f64 / 1024.0 / 1024.0),
        );
        writeln!(
            out,
            "\nbuild: mica {} ({}) | isa: {isa} | repack: {} | peak RSS: {rss}",
            env!("CARGO_PKG_VERSION"),
            build_commit(),
            if plan.no_repack { "off" } else { "on" }
        )?;
    }
    out.flush()?;
    if let Some(path) = &plan.chart {
        let bars: Vec<crate::charts::BenchBar> = records
            .iter()
            .zip(names)
            .map(|(r, test)| crate::charts::BenchBar {
                test,
                threads: r.n_threads,
                avg: r.avg_ts,
                std: r.stddev_ts,
            })
            .collect();
        let file = std::path::Path::new(&records[0].model_filename)
            .file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        let title = format!("mica bench: {file} — {cpu}, {isa}");
        crate::charts::bench_chart(path, &title, &bars)
            .with_context(|| format!("--chart {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn record(
    info: &ModelSummary,
    cpu: &str,
    isa: &str,
    n_threads: usize,
    spec: TestSpec,
    test_time: String,
    samples_ns: Vec<u64>,
) -> Record {
    let stats = Stats::of(&samples_ns, spec.n_prompt + spec.n_gen);
    Record {
        build_commit: build_commit().to_string(),
        build_number: 0,
        cpu_info: cpu.to_string(),
        gpu_info: String::new(),
        backends: "CPU".into(),
        model_filename: info.filename.clone(),
        model_type: info.desc.clone(),
        model_size: info.size,
        model_n_params: info.n_params,
        n_batch: PROMPT_CHUNK,
        n_ubatch: PROMPT_CHUNK,
        n_threads,
        type_k: info.type_k.into(),
        type_v: info.type_v.into(),
        n_gpu_layers: 0,
        flash_attn: 1,
        n_prompt: spec.n_prompt,
        n_gen: spec.n_gen,
        n_depth: spec.n_depth,
        test_time,
        avg_ns: stats.avg_ns.round() as u64,
        stddev_ns: stats.stddev_ns.round() as u64,
        avg_ts: stats.avg_ts,
        stddev_ts: stats.stddev_ts,
        samples_ns,
        samples_ts: stats.samples_ts,
        isa: isa.to_string(),
        peak_rss_bytes: peak_rss_bytes(),
        kv_bytes_per_token: info.kv_bytes_per_token,
        spec: None,
        draft_tokens: None,
        accepted_draft_tokens: None,
    }
}

/// The commit mica was built from, when the build passed one in `MICA_BUILD_COMMIT`.
fn build_commit() -> &'static str {
    option_env!("MICA_BUILD_COMMIT").unwrap_or("unknown")
}

/// Now as RFC 3339 UTC (`2025-01-31T12:00:00Z`), llama-bench's `test_time`.
fn rfc3339_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (H. Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// llama-bench's markdown table, one row printed as each test finishes.
struct TablePrinter {
    model: String,
    size: String,
    params: String,
}

/// Column widths as llama-bench's `get_field_width`: negative is left-aligned.
const COLUMNS: [(&str, i32); 7] = [
    ("model", -30),
    ("size", 10),
    ("params", 10),
    ("backend", -10),
    ("threads", 7),
    ("test", 15),
    ("t/s", 20),
];

impl TablePrinter {
    fn start(info: &ModelSummary) -> Result<TablePrinter> {
        let cells: Vec<String> = COLUMNS.iter().map(|c| c.0.to_string()).collect();
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", Self::line(&cells))?;
        let rule: String = COLUMNS
            .iter()
            .map(|&(_, w)| {
                let dashes = "-".repeat(w.unsigned_abs() as usize - 1);
                format!(" {dashes}{} |", if w > 0 { ':' } else { '-' })
            })
            .collect();
        writeln!(out, "|{rule}")?;
        out.flush()?;
        let mib = 1024.0 * 1024.0;
        Ok(TablePrinter {
            model: info.desc.clone(),
            size: if info.size < 1024 * 1024 * 1024 {
                format!("{:.2} MiB", info.size as f64 / mib)
            } else {
                format!("{:.2} GiB", info.size as f64 / mib / 1024.0)
            },
            params: if info.n_params < 1_000_000_000 {
                format!("{:.2} M", info.n_params as f64 / 1e6)
            } else {
                format!("{:.2} B", info.n_params as f64 / 1e9)
            },
        })
    }

    fn line(cells: &[String]) -> String {
        let body: String = COLUMNS
            .iter()
            .zip(cells)
            .map(|(&(_, w), c)| {
                let width = w.unsigned_abs() as usize;
                if w < 0 {
                    format!(" {c:<width$} |")
                } else {
                    format!(" {c:>width$} |")
                }
            })
            .collect();
        format!("|{body}")
    }

    fn row(&mut self, rec: &Record, spec: TestSpec) -> Result<()> {
        let cells = [
            self.model.clone(),
            self.size.clone(),
            self.params.clone(),
            rec.backends.clone(),
            rec.n_threads.to_string(),
            spec.name(),
            format!("{:.2} ± {:.2}", rec.avg_ts, rec.stddev_ts),
        ];
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", Self::line(&cells))?;
        out.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }

    #[test]
    fn lists() {
        assert_eq!(parse_list("-p", "n", "128, 512").unwrap(), vec![128, 512]);
        assert!(parse_list("-p", "n", "").is_err());
        assert!(parse_list("-p", "n", " , ").is_err());
        assert!(parse_list("-p", "n", "12x").is_err());
    }
}
