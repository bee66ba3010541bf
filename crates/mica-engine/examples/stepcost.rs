use mica_engine::Session;
use mica_models::LoadedModel;
use std::time::Instant;
fn main() {
    let path = std::env::args().nth(1).unwrap();
    let threads: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(2);
    let lm = LoadedModel::open(&path).unwrap();
    let mut s = Session::new(&lm, 2048, threads);
    let prompt: Vec<u32> = (0..200).map(|i| 100 + (i * 37) % 5000).collect();
    for k in [0usize, 1, 2, 3, 4, 6, 8, 12, 16] {
        let mut best = f64::MAX;
        let mut tot = 0.0;
        let reps = 20;
        for r in 0..reps {
            s.truncate(200);
            if r == 0 {
                s.reset();
                s.eval(&prompt, false).unwrap();
            }
            let toks: Vec<u32> = (0..=k as u32).map(|i| 500 + i).collect();
            let t = Instant::now();
            s.eval(&toks, k > 0).unwrap();
            let dt = t.elapsed().as_secs_f64();
            best = best.min(dt);
            tot += dt;
        }
        println!(
            "k={k:2} best {:.2} ms mean {:.2} ms",
            best * 1e3,
            tot / reps as f64 * 1e3
        );
    }
}
