//! Causal grouped-query attention over the paged KV cache.
//!
//! Every query token attends to the cached positions `0..=pos` of its own sequence; query
//! head `h` reads key/value head `h / (n_head / n_head_kv)`. Two numeric paths, chosen the
//! way llama.cpp's CPU flash attention chooses them, so that mica follows its rounding:
//! - *vector* (batches under [`TILED_MIN_TOKENS`] tokens, which includes all of decoding):
//!   the query is rounded to f16, scores are f16·f16 dots, and the softmax-weighted sum of
//!   values is accumulated online in f16 (ggml's `VKQ16`).
//! - *tiled* (longer batches): query tiles of up to 64 rows against key/value tiles of 64
//!   positions converted to f32 once per tile, with the arithmetic of llama.cpp's tiled
//!   flash attention ([`mica_kernels::attention`]).
//!
//! A cache of other types (quantized keys or values, `--cache-type-k/-v`) is attended by
//! [`super::attention_blocks`], llama.cpp's arithmetic for those types.
//!
//! With an f32 cache ([`crate::config::Numerics::F32`]) the vector path keeps everything in
//! f32 (f32 query, f32 dot products and accumulator) and the tiled path reads the f32 rows
//! as they are: no step rounds to f16.
//!
//! Keys and values are read through each sequence's block table ([`SeqKv`]): the vector path
//! resolves every position through it; the tiled path hands the kernel contiguous rows,
//! gathering a sequence's blocks into a per-thread buffer first unless they are already
//! consecutive. Either way the values and the order of the arithmetic are unchanged.
//!
//! Reference: "Self-attention Does Not Need O(n²) Memory" (Rabe & Staats) for the online
//! softmax; ggml-cpu `ggml_compute_forward_flash_attn_ext_f16` for the numerics.

use crate::kv_cache::{CacheElem, CacheTypes, KvCache, KvType, SeqId, SeqKv};
use half::f16;
use mica_kernels::ThreadPool;
use mica_kernels::attention::{KvHead, Q_TILE, ScoreMod, TileScratch, attend_tile_batch};
use mica_kernels::ops::f16v;
use mica_kernels::pool::split_range;
use std::cell::RefCell;
use std::ops::Range;
use std::thread::LocalKey;

/// Batches with at least this many tokens use the f32 (tiled) path, as llama.cpp does.
pub const TILED_MIN_TOKENS: usize = 64;

/// Which numeric path attention takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionPolicy {
    /// llama.cpp's rule: the tiled path for batches of [`TILED_MIN_TOKENS`] or more tokens,
    /// the vector path otherwise. mica then computes what llama.cpp computes for the same
    /// batches.
    #[default]
    Auto,
    /// Always the vector path: every token gets the arithmetic it would get if the tokens
    /// arrived one at a time (what llama.cpp computes while decoding). Used to compare a
    /// teacher-forced batch with a reference generated token by token.
    Vector,
    /// llama.cpp's rule applied to each sequence's run of consecutive tokens on its own: a
    /// run of [`TILED_MIN_TOKENS`] or more takes the tiled path, a shorter one the vector
    /// path. A sequence then gets the same arithmetic whatever other sequences share the
    /// batch (what a continuous-batching server needs for batch-invariant results), and
    /// the same as llama.cpp when it runs alone. The runs of sequences the caller names
    /// (`tiled_seqs` of [`attention`]) take the tiled path whatever their length: the rest
    /// of a long prompt whose first tokens came from a prefix cache computes as the whole
    /// prompt would.
    PerSequence,
}

/// Shape of the attention of one layer.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Multiplies q·k (usually 1/sqrt(head_dim)).
    pub scale: f32,
    /// Attention logit soft-capping (`cap · tanh(s / cap)`), where the model uses it.
    pub softcap: Option<f32>,
    /// Sliding window of this layer: a query at `p` sees positions `p - window + 1 ..= p`.
    pub window: Option<usize>,
    pub policy: AttentionPolicy,
}

impl AttnShape {
    /// How scores are scaled, capped and masked (shared with the tile kernel).
    pub fn score_mod(&self) -> ScoreMod {
        ScoreMod {
            scale: self.scale,
            softcap: self.softcap,
            window: self.window,
        }
    }
}

/// `out[t]` = attention of query row `q[t]` (`[n_head * head_dim]`) over its sequence.
/// `seq[t]`/`pos[t]` place token `t`; the cache already holds its own key and value.
/// `tiled_seqs`: sequences whose runs take the tiled path under
/// [`AttentionPolicy::PerSequence`] whatever their length.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    pool: &ThreadPool,
    shape: AttnShape,
    cache: &KvCache,
    layer: usize,
    seq: &[SeqId],
    pos: &[usize],
    tiled_seqs: &[SeqId],
    q: &[f32],
    out: &mut [f32],
) {
    let args = (seq, pos, tiled_seqs);
    match cache.cache_types() {
        CacheTypes {
            k: KvType::F16,
            v: KvType::F16,
        } => attention_typed::<f16>(pool, shape, cache, layer, args, q, out),
        CacheTypes {
            k: KvType::F32,
            v: KvType::F32,
        } => attention_typed::<f32>(pool, shape, cache, layer, args, q, out),
        // Any other pair is stored as blocks, which llama.cpp attends over by its vector
        // path whatever the batch size.
        _ => super::attention_blocks::attention_blocks(pool, shape, cache, layer, seq, pos, q, out),
    }
}

/// A cache element type with its vector-path arithmetic and its per-thread gather buffers.
trait AttnElem: CacheElem {
    /// Attention of one query head over positions `lo..n_kv` of one KV head.
    fn head(
        kv: &HeadKv<Self>,
        q: &[f32],
        sm: &ScoreMod,
        lo: usize,
        s: &mut Scratch,
        out: &mut [f32],
    );
    /// Runs `f` with this thread's gather buffers (`[n_kv][kv_dim]` keys and values per
    /// sequence of a tiled call, kept between calls).
    fn with_gather<R>(f: impl FnOnce(&mut Vec<(Vec<Self>, Vec<Self>)>) -> R) -> R;
}

impl AttnElem for f16 {
    fn head(
        kv: &HeadKv<f16>,
        q: &[f32],
        sm: &ScoreMod,
        lo: usize,
        s: &mut Scratch,
        out: &mut [f32],
    ) {
        head_f16(kv, q, sm, lo, s, out)
    }
    fn with_gather<R>(f: impl FnOnce(&mut Vec<(Vec<f16>, Vec<f16>)>) -> R) -> R {
        GATHER.with_borrow_mut(f)
    }
}

impl AttnElem for f32 {
    fn head(
        kv: &HeadKv<f32>,
        q: &[f32],
        sm: &ScoreMod,
        lo: usize,
        s: &mut Scratch,
        out: &mut [f32],
    ) {
        head_f32(kv, q, sm, lo, s, out)
    }
    fn with_gather<R>(f: impl FnOnce(&mut Vec<(Vec<f32>, Vec<f32>)>) -> R) -> R {
        GATHER_F32.with_borrow_mut(f)
    }
}

/// [`attention`] over a cache holding `T`.
fn attention_typed<T: AttnElem>(
    pool: &ThreadPool,
    shape: AttnShape,
    cache: &KvCache,
    layer: usize,
    (seq, pos, tiled_seqs): (&[SeqId], &[usize], &[SeqId]),
    q: &[f32],
    out: &mut [f32],
) {
    let n_tok = seq.len();
    let q_dim = shape.n_head * shape.head_dim;
    debug_assert_eq!(q.len(), n_tok * q_dim);
    debug_assert_eq!(out.len(), n_tok * q_dim);
    let tiled_run = |r: &(usize, usize)| r.1 >= TILED_MIN_TOKENS || tiled_seqs.contains(&seq[r.0]);
    match shape.policy {
        AttentionPolicy::Auto if n_tok >= TILED_MIN_TOKENS => {
            attention_tiled::<T>(pool, shape, cache, layer, seq, pos, q, out, &[(0, n_tok)])
        }
        AttentionPolicy::PerSequence if seq_runs(seq).any(|r| tiled_run(&r)) => {
            // Long runs (and those of the named sequences) tiled, the rest (decoding
            // sequences, short chunks) by the vector path.
            let (long, short): (Vec<_>, Vec<_>) = seq_runs(seq).partition(tiled_run);
            attention_tiled::<T>(pool, shape, cache, layer, seq, pos, q, out, &long);
            let rows: Vec<usize> = short.iter().flat_map(|&(t, n)| t..t + n).collect();
            attention_vector::<T>(pool, shape, cache, layer, seq, pos, q, out, Some(&rows));
        }
        _ => attention_vector::<T>(pool, shape, cache, layer, seq, pos, q, out, None),
    }
}

/// Runs of consecutive tokens of one sequence: `(first token, count)`.
fn seq_runs(seq: &[SeqId]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut t = 0;
    std::iter::from_fn(move || {
        if t >= seq.len() {
            return None;
        }
        let start = t;
        while t < seq.len() && seq[t] == seq[start] {
            t += 1;
        }
        Some((start, t - start))
    })
}

/// The vector path for the tokens `rows` (every token when `None`).
fn attention_vector<T: AttnElem>(
    pool: &ThreadPool,
    shape: AttnShape,
    cache: &KvCache,
    layer: usize,
    seq: &[SeqId],
    pos: &[usize],
    q: &[f32],
    out: &mut [f32],
    rows: Option<&[usize]>,
) {
    let q_dim = shape.n_head * shape.head_dim;
    let n_rows = rows.map_or(seq.len(), |r| r.len());
    let items = n_rows * shape.n_head;
    if items == 0 {
        return;
    }
    let dst = OutPtr(out.as_mut_ptr());
    let sm = shape.score_mod();
    run_split(pool, items, &SCRATCH, |range, scratch| {
        scratch.resize(shape.head_dim);
        for item in range {
            let (r, h) = (item / shape.n_head, item % shape.n_head);
            let t = rows.map_or(r, |rows| rows[r]);
            let g = h / (shape.n_head / shape.n_head_kv);
            let qh = &q[t * q_dim + h * shape.head_dim..][..shape.head_dim];
            // SAFETY: item (t, h) owns this slice of `out`; items are split disjointly.
            let o = unsafe { dst.slice(t * q_dim + h * shape.head_dim, shape.head_dim) };
            let kv = HeadKv {
                kv: cache
                    .typed_view::<T>(layer, seq[t])
                    .expect("the cache's type"),
                n_kv: pos[t] + 1,
                offset: g * shape.head_dim,
                head_dim: shape.head_dim,
            };
            T::head(&kv, qh, &sm, sm.first_visible(pos[t]), scratch, o);
        }
    });
}

/// Runs `work` over the items `0..items`, one contiguous range of them per thread of `pool`
/// ([`split_range`]), each thread with its own buffers `scratch` (a thread-local kept between
/// calls); a single item runs on the calling thread.
pub(super) fn run_split<S: 'static>(
    pool: &ThreadPool,
    items: usize,
    scratch: &'static LocalKey<RefCell<S>>,
    work: impl Fn(Range<usize>, &mut S) + Sync,
) {
    let run = |i: usize, nt: usize| {
        scratch.with_borrow_mut(|s| work(split_range(items, i, nt, 1), s));
    };
    if items == 1 {
        run(0, 1);
    } else {
        pool.run(run);
    }
}

/// The tiled path for the token runs `runs` (`(first token, count)`, one sequence each):
/// query rows grouped in tiles of up to [`Q_TILE`] consecutive tokens of one sequence, per
/// head; each tile is one work item for the thread pool.
fn attention_tiled<T: AttnElem>(
    pool: &ThreadPool,
    shape: AttnShape,
    cache: &KvCache,
    layer: usize,
    seq: &[SeqId],
    pos: &[usize],
    q: &[f32],
    out: &mut [f32],
    runs: &[(usize, usize)],
) {
    let (hd, q_dim) = (shape.head_dim, shape.n_head * shape.head_dim);
    // Runs of consecutive tokens of one sequence, cut into tiles: (first token, count).
    let mut tiles: Vec<(usize, usize)> = Vec::new();
    for &(start, len) in runs {
        let mut t = start;
        while t < start + len {
            let mut end = t + 1;
            while end < start + len && seq[end] == seq[t] && end - t < Q_TILE {
                end += 1;
            }
            tiles.push((t, end - t));
            t = end;
        }
    }
    T::with_gather(|gather| {
        // Contiguous `[n_kv][kv_dim]` keys and values of each sequence with tiles: the pool
        // itself when its blocks are consecutive, else a copy.
        let mut spans: Vec<(SeqId, usize)> = Vec::new();
        for &(t0, rows) in &tiles {
            let n_kv = pos[t0..t0 + rows].iter().max().map_or(0, |p| p + 1);
            match spans.iter_mut().find(|e| e.0 == seq[t0]) {
                Some(e) => e.1 = e.1.max(n_kv),
                None => spans.push((seq[t0], n_kv)),
            }
        }
        if gather.len() < spans.len() {
            gather.resize_with(spans.len(), Default::default);
        }
        let mut views: Vec<(SeqId, &[T], &[T])> = Vec::with_capacity(spans.len());
        for (&(s, n_kv), buf) in spans.iter().zip(gather.iter_mut()) {
            let view = cache.typed_view::<T>(layer, s).expect("the cache's type");
            match view.contiguous(n_kv) {
                Some((k, v)) => views.push((s, k, v)),
                None => {
                    view.gather(n_kv, &mut buf.0, &mut buf.1);
                    views.push((s, &buf.0, &buf.1));
                }
            }
        }
        let items = tiles.len() * shape.n_head;
        let dst = OutPtr(out.as_mut_ptr());
        let sm = shape.score_mod();
        // Items are dealt out round-robin, not in contiguous ranges: a causal tile's cost
        // grows with its position, so contiguous ranges leave the first thread with the
        // cheap early tiles and the last one with the expensive late ones (at 512 tokens
        // and two threads, 10 vs 26 key tiles per head). They are numbered KV head by KV
        // head, then tile by tile, then by query head of the group, so that each thread's
        // consecutive items mostly share a KV head and its converted keys and values
        // (`TileScratch` keeps one head's, extended as the tiles advance) instead of
        // converting them again at almost every item.
        let group = shape.n_head / shape.n_head_kv;
        let item_of = |item: usize| {
            let (g, rest) = (item / (tiles.len() * group), item % (tiles.len() * group));
            (tiles[rest / group], g * group + rest % group)
        };
        pool.run(|i, nt| {
            TILE_SCRATCH.with_borrow_mut(|(scratch, qbuf, obuf)| {
                // The cache holds this call's keys and values from here on: converted rows
                // are reused across this thread's tiles and query heads, not across calls.
                scratch.begin_batch();
                for item in (i..items).step_by(nt) {
                    let ((t0, rows), h) = item_of(item);
                    let g = h / group;
                    let &(_, keys, values) = views
                        .iter()
                        .find(|e| e.0 == seq[t0])
                        .expect("gathered above");
                    let kv = KvHead {
                        keys,
                        values,
                        stride: shape.n_head_kv * hd,
                        offset: g * hd,
                        head_dim: hd,
                    };
                    qbuf.clear();
                    for r in 0..rows {
                        qbuf.extend_from_slice(&q[(t0 + r) * q_dim + h * hd..][..hd]);
                    }
                    obuf.resize(rows * hd, 0.0);
                    attend_tile_batch(&kv, qbuf, &pos[t0..t0 + rows], &sm, scratch, obuf);
                    for r in 0..rows {
                        // SAFETY: (tile, head) items write disjoint rows/heads of `out`.
                        let o = unsafe { dst.slice((t0 + r) * q_dim + h * hd, hd) };
                        o.copy_from_slice(&obuf[r * hd..(r + 1) * hd]);
                    }
                }
            })
        });
    });
}

/// One KV head of one sequence: positions `0..n_kv`, the head at `offset` of each row.
struct HeadKv<'a, T> {
    kv: SeqKv<'a, T>,
    n_kv: usize,
    offset: usize,
    head_dim: usize,
}

impl<T: Copy> HeadKv<'_, T> {
    fn key(&self, j: usize) -> &[T] {
        &self.kv.key_row(j)[self.offset..][..self.head_dim]
    }
    fn value(&self, j: usize) -> &[T] {
        &self.kv.value_row(j)[self.offset..][..self.head_dim]
    }
}

/// Per-thread buffers of one head's attention, kept between calls (no allocation per step).
#[derive(Default)]
struct Scratch {
    q16: Vec<f16>,
    acc16: Vec<f16>,
    /// One tile of positions: their scores, then the online softmax's weights.
    steps: SoftmaxSteps,
}

impl Scratch {
    fn resize(&mut self, head_dim: usize) {
        self.q16.resize(head_dim, f16::ZERO);
        self.acc16.resize(head_dim, f16::ZERO);
        self.steps.resize(1);
    }
}

/// Cached positions whose scores the vector paths compute before they update the softmax
/// state, so that the `expf` calls of the tile run side by side
/// ([`mica_kernels::ops::libm_expf`]). The arithmetic per position is unchanged.
pub(super) const POS_TILE: usize = 64;

/// The online softmax of ggml's one-chunk attention, a tile of positions at a time. Per
/// position, ggml computes either `ms = expf(M - s)` (a new maximum: the accumulator and the
/// sum are scaled by it, the position weighs 1) or `vs = expf(s - M)` (the position's
/// weight). The maxima depend only on the scores, so the arguments of a whole tile are known
/// before any `expf`; the tile's `expf` then run at once, bit-identical to the calls one by
/// one.
#[derive(Default)]
pub(super) struct SoftmaxSteps {
    /// `[rows][POS_TILE]`: the scores, per query head.
    pub(super) scores: Vec<f32>,
    /// `[POS_TILE]`: `expf`'s argument, then its value, for one row.
    e: Vec<f32>,
    /// `[POS_TILE]`: whether the position raised the maximum (its `e` is `ms`, else `vs`).
    grew: Vec<bool>,
}

impl SoftmaxSteps {
    pub(super) fn resize(&mut self, rows: usize) {
        self.scores.resize(rows * POS_TILE, 0.0);
        self.e.resize(POS_TILE, 0.0);
        self.grew.resize(POS_TILE, false);
    }

    /// Row `row`'s scores of `n` positions: updates the running maximum `m` and returns each
    /// position's `(ms, vs)` in order.
    pub(super) fn weights(
        &mut self,
        row: usize,
        n: usize,
        m: &mut f32,
    ) -> impl Iterator<Item = (f32, f32)> + '_ {
        let scores = &self.scores[row * POS_TILE..][..n];
        for ((&sc, e), g) in scores.iter().zip(&mut self.e).zip(&mut self.grew) {
            if sc > *m {
                *e = *m - sc;
                *g = true;
                *m = sc;
            } else {
                *e = sc - *m;
                *g = false;
            }
        }
        mica_kernels::ops::libm_expf::expf_slice(&mut self.e[..n]);
        self.e[..n]
            .iter()
            .zip(&self.grew)
            .map(|(&e, &g)| if g { (e, 1.0) } else { (1.0, e) })
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    /// The tile kernel's buffers plus the gathered query rows and the output rows of a tile.
    static TILE_SCRATCH: RefCell<(TileScratch, Vec<f32>, Vec<f32>)> =
        RefCell::new(Default::default());
    /// Per sequence of a tiled call: its keys and values gathered out of the block pool,
    /// `[n_kv][kv_dim]` each (kept between calls).
    static GATHER: RefCell<Vec<(Vec<f16>, Vec<f16>)>> = const { RefCell::new(Vec::new()) };
    static GATHER_F32: RefCell<Vec<(Vec<f32>, Vec<f32>)>> = const { RefCell::new(Vec::new()) };
}

/// The vector path: f16 query, online softmax, f16 accumulator, over cached positions
/// `lo..n_kv` (positions before `lo` are outside the sliding window: ggml skips masked
/// positions, so starting later is the same arithmetic).
fn head_f16(
    kv: &HeadKv<f16>,
    q: &[f32],
    sm: &ScoreMod,
    lo: usize,
    s: &mut Scratch,
    out: &mut [f32],
) {
    mica_kernels::ops::f32_to_f16(q, &mut s.q16);
    s.acc16.fill(f16::ZERO);
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    for j0 in (lo..kv.n_kv).step_by(POS_TILE) {
        let js = j0..(j0 + POS_TILE).min(kv.n_kv);
        for (sc, j) in s.steps.scores.iter_mut().zip(js.clone()) {
            *sc = sm.apply(f16v::dot(&s.q16, kv.key(j)));
        }
        for ((ms, vs), j) in s.steps.weights(0, js.len(), &mut m).zip(js) {
            if ms != 1.0 {
                f16v::scale(&mut s.acc16, ms);
            }
            f16v::mad(&mut s.acc16, kv.value(j), vs);
            // ggml computes `S*ms + vs` with one fused multiply-add (GCC contracts it).
            sum = sum.mul_add(ms, vs);
        }
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for (o, a) in out.iter_mut().zip(&s.acc16) {
        *o = a.to_f32() * inv;
    }
}

/// The vector path over an f32 cache: f32 query, online softmax, f32 accumulator.
fn head_f32(
    kv: &HeadKv<f32>,
    q: &[f32],
    sm: &ScoreMod,
    lo: usize,
    s: &mut Scratch,
    out: &mut [f32],
) {
    out.fill(0.0);
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    for j0 in (lo..kv.n_kv).step_by(POS_TILE) {
        let js = j0..(j0 + POS_TILE).min(kv.n_kv);
        for (sc, j) in s.steps.scores.iter_mut().zip(js.clone()) {
            let k = kv.key(j);
            *sc = sm.apply(q.iter().zip(k).fold(0f32, |a, (&x, &y)| x.mul_add(y, a)));
        }
        for ((ms, vs), j) in s.steps.weights(0, js.len(), &mut m).zip(js) {
            if ms != 1.0 {
                for o in out.iter_mut() {
                    *o *= ms;
                }
            }
            for (o, &v) in out.iter_mut().zip(kv.value(j)) {
                *o = v.mul_add(vs, *o);
            }
            sum = sum.mul_add(ms, vs);
        }
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for o in out.iter_mut() {
        *o *= inv;
    }
}

#[derive(Clone, Copy)]
pub(super) struct OutPtr(pub(super) *mut f32);
unsafe impl Sync for OutPtr {}
unsafe impl Send for OutPtr {}
impl OutPtr {
    /// SAFETY: in bounds and not accessed by another thread concurrently.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn slice<'a>(self, start: usize, len: usize) -> &'a mut [f32] {
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}
