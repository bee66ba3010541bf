//! Time to open (map + validate header, metadata and tensor directory) a model file, GGUF or
//! `.mica`, averaged over runs: `cargo run -p mica-formats --example open_time -- FILE...`.

use std::time::Instant;

fn main() {
    const RUNS: u32 = 20;
    for path in std::env::args().skip(1) {
        // One warm-up open so every file is measured with its pages cached.
        if let Err(e) = mica_formats::GgufFile::open(&path) {
            eprintln!("{e}");
            std::process::exit(1);
        }
        let t = Instant::now();
        for _ in 0..RUNS {
            let f = mica_formats::GgufFile::open(&path).expect("opened once already");
            std::hint::black_box(f.tensors().len());
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / RUNS as f64;
        println!("{path}: open + validate {ms:.2} ms (mean of {RUNS})");
    }
}
