//! Fork/join cost of the compute thread pool: one empty job handed to every thread and
//! waited for. Decoding a small model runs a few hundred jobs per token, so this cost must
//! stay in the low microseconds.

use criterion::{Criterion, criterion_group, criterion_main};
use mica_kernels::ThreadPool;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};

fn fork_join(c: &mut Criterion) {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut g = c.benchmark_group("pool_fork_join");
    let mut counts = vec![1, 2, cores.max(2)];
    counts.dedup();
    for n in counts {
        let pool = ThreadPool::new(n);
        let hits = AtomicUsize::new(0);
        g.bench_function(format!("{n}_threads"), |b| {
            b.iter(|| {
                pool.run(|i, _| {
                    hits.fetch_add(black_box(i), Ordering::Relaxed);
                })
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_secs(1));
    targets = fork_join
}
criterion_main!(benches);
