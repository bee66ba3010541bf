//! Time to open a model file: mmap plus header and directory validation (no tensor bytes
//! read, no checksums), for GGUF and `.mica`, as docs/format.md reports.
//!
//! Usage: cargo run --release -p mica-formats --example open_time -- FILE.gguf FILE.mica [N]

use mica_formats::{GgufFile, MicaFile};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: open_time FILE.gguf FILE.mica [N]");
        std::process::exit(2);
    }
    let n: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(50);
    for round in 0..2 {
        let t = Instant::now();
        for _ in 0..n {
            let f = GgufFile::open(&args[1]).expect("GGUF opens");
            std::hint::black_box(f.tensors().len());
        }
        let gguf = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        let t = Instant::now();
        for _ in 0..n {
            let f = MicaFile::open(&args[2]).expect(".mica opens");
            std::hint::black_box(&f);
        }
        let mica = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        println!("round {round}: GGUF {gguf:.0} µs, .mica {mica:.0} µs per open ({n} opens each)");
    }
}
