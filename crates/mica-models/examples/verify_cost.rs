//! What a speculative verification pass costs: the time of one forward pass of `1 + k`
//! tokens at a fixed depth, with verification's one-token matrix paths (`alone`) and with the
//! batch paths, against a one-token pass. A probe to run and report, not a test.
//!
//! Usage: `cargo run --release -p mica-models --example verify_cost -- MODEL.gguf [K,K,..] [REPS]`
//! (defaults: k = 0,1,3,5,7; 12 repetitions; depth 500; 2 threads). Prints the best and mean
//! milliseconds per pass.

use mica_kernels::ThreadPool;
use mica_models::{Batch, KvCache, LoadedModel, Workspace};
use std::time::Instant;

const DEPTH: usize = 500;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: verify_cost MODEL.gguf [K,K,..] [REPS]")?;
    let ks: Vec<usize> = match args.next() {
        Some(s) => s.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![0, 1, 3, 5, 7],
    };
    let reps: usize = args.next().map_or(Ok(12), |s| s.parse())?;
    let lm = LoadedModel::open(&path)?;
    let pool = ThreadPool::new(2);
    let mut kv = KvCache::new(&lm.model.config, DEPTH + 64, 1);
    let mut ws = Workspace::default();
    let ids: Vec<u32> = (0..DEPTH as u32).map(|i| 1000 + i * 7).collect();
    for (i, c) in ids.chunks(256).enumerate() {
        let b = Batch::for_sequence(c, i * 256, 0, false);
        lm.model.forward(&pool, &b, &mut kv, &mut ws)?;
    }
    for k in ks {
        for alone in [true, false] {
            let (mut best, mut total) = (f64::MAX, 0.0);
            for _ in 0..reps {
                let toks: Vec<u32> = (0..=k as u32).map(|i| 2000 + i).collect();
                let b = Batch::for_sequence(&toks, DEPTH, 0, true);
                ws.alone_paths = alone && k > 0;
                let t = Instant::now();
                lm.model.forward(&pool, &b, &mut kv, &mut ws)?;
                let ms = t.elapsed().as_secs_f64() * 1e3;
                ws.alone_paths = false;
                kv.truncate(0, DEPTH);
                best = best.min(ms);
                total += ms;
            }
            let mean = total / reps as f64;
            println!(
                "{} tokens, one-token paths {alone}: best {best:.2} ms, mean {mean:.2} ms",
                k + 1
            );
        }
    }
    Ok(())
}
