//! Adapters chosen per sequence: a [`LoraSelection`] (adapters and scales) for each sequence
//! that has one, and the forward pass's [`RowAdapters`], which groups the batch's rows by
//! adapter (Punica / S-LoRA style) so that each projection applies each adapter once, to
//! the rows of every sequence that selected it, each at that sequence's scale. The base
//! product stays one call for the whole batch.
//!
//! An adapter's products (f32 or f16 matrices) take one code path whatever the number of
//! rows, so a row's update is the same in any grouping: a sequence gets exactly what it gets
//! alone, and what `Model::attach_lora` (every token) gives at the same scale.

use super::LoraAdapter;
use crate::kv_cache::SeqId;
use mica_kernels::ThreadPool;
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::sync::Arc;

/// The adapters one sequence runs with, in order, each at a scale that multiplies the
/// adapter's own (`alpha / r`): llama-server's per-request `lora` list.
#[derive(Clone, Default)]
pub struct LoraSelection {
    pub adapters: Vec<(Arc<LoraAdapter>, f32)>,
}

impl std::fmt::Debug for LoraSelection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.adapters.iter().map(|(a, s)| (a.path.display(), s)))
            .finish()
    }
}

impl LoraSelection {
    pub fn is_empty(&self) -> bool {
        self.adapters.is_empty()
    }

    /// A key naming the adapters (by identity, not path: an adapter loaded again is another
    /// adapter) and their scales, bit for bit: 0 for none. Prefix caches mix it into their
    /// first block's key, so keys and values computed under one selection never serve
    /// another.
    pub fn cache_key(&self) -> u64 {
        if self.adapters.is_empty() {
            return 0;
        }
        let mut h = std::hash::DefaultHasher::new();
        for (a, s) in &self.adapters {
            a.uid.hash(&mut h);
            s.to_bits().hash(&mut h);
        }
        h.finish().max(1)
    }
}

/// Rows of the input and the scale they take an adapter at.
type Run = (Range<usize>, f32);

/// No selection for a row.
const NONE: u32 = u32::MAX;

/// Which rows of the forward pass's current input take which adapters, grouped by adapter.
/// Set per pass from the sequences' selections ([`RowAdapters::set`]); the pass keeps it in
/// step with its rows (the last layer keeping only output rows, feed-forward chunks).
#[derive(Default)]
pub(crate) struct RowAdapters {
    /// Selection per row (index into `sels`, or [`NONE`]).
    labels: Vec<u32>,
    sels: Vec<Arc<LoraSelection>>,
    /// Per adapter: runs of rows taking it, each with its scale.
    groups: Vec<(Arc<LoraAdapter>, Vec<Run>)>,
    /// Row of the whole input that row 0 of the projection's input is (feed-forward
    /// chunks).
    pub offset: usize,
}

thread_local! {
    /// Rows of several runs gathered for one product.
    static GATHER: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl RowAdapters {
    /// The rows of a batch whose tokens belong to sequences `seq` (one per row), for the
    /// selections `by_seq` names.
    pub fn set(&mut self, by_seq: &[(SeqId, Arc<LoraSelection>)], seq: &[SeqId]) {
        self.labels.clear();
        self.sels.clear();
        self.groups.clear();
        self.offset = 0;
        if by_seq.iter().all(|(_, s)| s.is_empty()) {
            return;
        }
        self.sels.extend(by_seq.iter().map(|(_, s)| s.clone()));
        self.labels.extend(seq.iter().map(|s| {
            by_seq
                .iter()
                .position(|(q, sel)| q == s && !sel.is_empty())
                .map_or(NONE, |i| i as u32)
        }));
        self.regroup();
    }

    /// Keeps rows `rows` (ascending), renumbered from 0.
    pub fn keep_rows(&mut self, rows: &[usize]) {
        if self.groups.is_empty() {
            return;
        }
        for (i, &r) in rows.iter().enumerate() {
            self.labels[i] = self.labels[r];
        }
        self.labels.truncate(rows.len());
        self.regroup();
    }

    fn regroup(&mut self) {
        self.groups.clear();
        let mut t = 0;
        while t < self.labels.len() {
            let l = self.labels[t];
            let mut end = t + 1;
            while end < self.labels.len() && self.labels[end] == l {
                end += 1;
            }
            if l != NONE {
                for (a, s) in &self.sels[l as usize].adapters {
                    match self.groups.iter_mut().find(|(g, _)| Arc::ptr_eq(g, a)) {
                        Some((_, runs)) => runs.push((t..end, *s)),
                        None => self.groups.push((a.clone(), vec![(t..end, *s)])),
                    }
                }
            }
            t = end;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Adds the updates of the projection whose weight is `name` to `out` (`[n, rows]`)
    /// for the `n` rows of `x` (`[n, cols]`), rows `offset..offset + n` of the input.
    pub fn apply(&self, pool: &ThreadPool, name: &str, x: &[f32], n: usize, out: &mut [f32]) {
        if n == 0 {
            return;
        }
        let (lo, hi) = (self.offset, self.offset + n);
        let mut runs = Vec::new();
        for (adapter, all) in &self.groups {
            let Some(pair) = adapter.pair(name) else {
                continue;
            };
            let (cols, ocols) = (pair.a.cols, pair.b.out());
            runs.clear();
            runs.extend(all.iter().filter_map(|(r, s)| {
                let (a, b) = (r.start.max(lo), r.end.min(hi));
                (a < b).then(|| (a - lo..b - lo, *s))
            }));
            let add = |delta: &[f32], out: &mut [f32], runs: &[Run]| {
                let mut d = delta.chunks_exact(ocols);
                for (r, s) in runs {
                    let scale = pair.scale * s;
                    for o in out[r.start * ocols..r.end * ocols].chunks_exact_mut(ocols) {
                        for (ov, dv) in o.iter_mut().zip(d.next().expect("gathered rows")) {
                            *ov += dv * scale;
                        }
                    }
                }
            };
            match &runs[..] {
                [] => {}
                [(r, _)] => {
                    let xs = &x[r.start * cols..r.end * cols];
                    pair.with_delta(pool, xs, r.len(), |d| add(d, out, &runs));
                }
                _ => GATHER.with_borrow_mut(|g| {
                    g.clear();
                    for (r, _) in &runs {
                        g.extend_from_slice(&x[r.start * cols..r.end * cols]);
                    }
                    let rows = g.len() / cols;
                    pair.with_delta(pool, g, rows, |d| add(d, out, &runs));
                }),
            }
        }
    }
}
