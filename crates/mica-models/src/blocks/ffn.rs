//! The dense feed-forward sub-block (gated, `down(act(gate(x)) * up(x))`, or plain,
//! `down(act(up(x)))`), run over a large batch in token chunks that keep llama.cpp's dot
//! paths, and the activations with the model's numerics.

use crate::config::{Activation, ModelConfig, Numerics};
use crate::model::{Expert, grow};
use crate::weights::{ActCache, Linear};
use mica_kernels::{ThreadPool, ops};

/// Tokens per feed-forward chunk of a large batch: the `[tokens, n_ff]` gate and up buffers
/// (and the quantized copy of their product) are sized for this many rows rather than for
/// the whole batch, which keeps peak memory down on long prompts (20 MB for Qwen2.5-0.5B at
/// 512 tokens) while a chunk still fills the matrix kernels' 64-token tiles.
pub const FFN_CHUNK: usize = 128;

/// The shortest feed-forward chunk (and tail): the larger of the batch sizes from which the
/// k-quants take llama.cpp's tiled path (8) and the legacy formats mica's `PerBlock` (16).
const MIN_CHUNK: usize = if mica_kernels::simd::PER_BLOCK_MIN_TOKENS > 8 {
    mica_kernels::simd::PER_BLOCK_MIN_TOKENS
} else {
    8
};

/// Splits the batch rows `0..n` into feed-forward chunks that keep every token on the dot
/// path it takes in one call over all `n` ([`mica_kernels::DotPath`]): boundaries fall on
/// multiples of 4, so repacked Q4_K's groups of four stay aligned and its leftover tokens
/// stay at the end, and a tail of fewer than [`MIN_CHUNK`] tokens is folded into the chunk
/// before it, so no chunk drops under the tiled k-quant path's 8-token threshold or the
/// legacy formats' `PerBlock` 16-token one.
pub(crate) fn ffn_chunks(n: usize, chunk: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    // Whole multiples of 4, at least MIN_CHUNK.
    let chunk = (chunk.max(MIN_CHUNK) / 4) * 4;
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= n {
            return None;
        }
        let mut end = start.saturating_add(chunk).min(n);
        if n - end < MIN_CHUNK {
            end = n;
        }
        let r = start..end;
        start = end;
        Some(r)
    })
}

/// A feed-forward without experts.
#[derive(Clone, Copy)]
pub(crate) enum Dense<'a> {
    Gated(&'a Expert),
    Plain { up: &'a Linear, down: &'a Linear },
}

/// One chunk of a dense feed-forward: `out = down(act(gate(x)) * up(x))` or
/// `down(act(up(x)))` for the `x.len() / n_embd` rows of `x`.
pub(crate) fn dense_ffn(
    cfg: &ModelConfig,
    pool: &ThreadPool,
    ffn: Dense<'_>,
    x: &[f32],
    (gate_buf, up_buf): (&mut Vec<f32>, &mut Vec<f32>),
    acts: &mut ActCache,
    out: &mut [f32],
) {
    let rows = x.len() / cfg.n_embd;
    acts.invalidate();
    let (h, down) = match ffn {
        Dense::Plain { up, down } => {
            let h = grow(up_buf, rows * up.out_dim());
            up.apply(pool, acts, x, rows, h);
            activate(cfg, h);
            (&*h, down)
        }
        Dense::Gated(e) => {
            let ff = e.gate.out_dim();
            let gate = grow(gate_buf, rows * ff);
            e.gate.apply(pool, acts, x, rows, gate);
            let up = grow(up_buf, rows * ff);
            e.up.apply(pool, acts, x, rows, up);
            glu_rows(cfg, pool, rows, gate, up);
            (&*gate, &e.down)
        }
    };
    acts.invalidate();
    down.apply(pool, acts, h, rows, out);
}

/// [`glu`] over `rows` rows, SwiGLU's split across `pool` for prompt batches at multiples of
/// 16 elements (so every range but the last is whole 16-lane groups, and the last keeps the
/// buffer's tail: the same operations on every element as one call).
fn glu_rows(cfg: &ModelConfig, pool: &ThreadPool, rows: usize, gate: &mut [f32], up: &[f32]) {
    if cfg.act != Activation::Silu {
        return glu(cfg, gate, up);
    }
    let n = gate.len();
    let g = crate::par::Shared::new(gate);
    crate::par::for_ranges(pool, rows, n, 16, |r| {
        // SAFETY: each range is one thread's.
        let gate = unsafe { g.range(r.clone()) };
        ops::swiglu(gate, &up[r]);
    });
}

/// The gated activation in place, `gate = act(gate) * up`, with the model's numerics.
pub(crate) fn glu(cfg: &ModelConfig, gate: &mut [f32], up: &[f32]) {
    match (cfg.act, cfg.numerics) {
        (Activation::Silu, _) => ops::swiglu(gate, up),
        (Activation::SwigluOai, _) => swiglu_oai(gate, up),
        (Activation::Relu, _) => gate
            .iter_mut()
            .zip(up)
            .for_each(|(g, &u)| *g = g.max(0.0) * u),
        (_, Numerics::LlamaCpp) => ops::geglu(gate, up),
        (_, Numerics::F32) => ops::geglu_precise(gate, up),
    }
}

/// gpt-oss's `swiglu_limit` and `swiglu_alpha` (fixed by llama.cpp's `swiglu_oai`).
pub const SWIGLU_OAI_LIMIT: f32 = 7.0;
pub const SWIGLU_OAI_ALPHA: f32 = 1.702;

/// gpt-oss's clamped SwiGLU in place: `g = min(gate, 7)`, `u = clamp(up, -7, 7)`,
/// `gate = g · sigmoid(1.702 g) · (u + 1)` (transformers `GptOssExperts._apply_gate`,
/// ggml's `swiglu_oai`).
fn swiglu_oai(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(SWIGLU_OAI_LIMIT);
        let y = u.clamp(-SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT);
        *g = x / (1.0 + (-SWIGLU_OAI_ALPHA * x).exp()) * (y + 1.0);
    }
}

/// The plain (ungated) MLP activation in place, with the model's numerics.
pub(crate) fn activate(cfg: &ModelConfig, h: &mut [f32]) {
    match (cfg.act, cfg.numerics) {
        (Activation::Silu, _) => ops::silu_in_place(h),
        (Activation::Relu, _) => h.iter_mut().for_each(|v| *v = v.max(0.0)),
        // Gated only (gpt-oss's experts): an ungated MLP takes its gate half.
        (Activation::SwigluOai, _) => h.iter_mut().for_each(|v| {
            let g = v.min(SWIGLU_OAI_LIMIT);
            *v = g / (1.0 + (-SWIGLU_OAI_ALPHA * g).exp());
        }),
        // llama.cpp computes every GELU with its f16 table of the tanh approximation.
        (_, Numerics::LlamaCpp) => ops::gelu(h),
        (Activation::GeluTanh, Numerics::F32) => ops::gelu_precise(h),
        (Activation::GeluErf, Numerics::F32) => ops::gelu_erf(h),
    }
}

#[cfg(test)]
mod ffn_chunk_tests {
    use super::ffn_chunks;

    #[test]
    fn chunks_cover_the_batch_on_multiples_of_four_with_no_short_tail() {
        for chunk in [1, 8, 10, 128, usize::MAX] {
            for n in 0..400 {
                let rs: Vec<_> = ffn_chunks(n, chunk).collect();
                let mut next = 0;
                for (i, r) in rs.iter().enumerate() {
                    assert_eq!(r.start, next, "n {n} chunk {chunk}: contiguous");
                    assert!(r.end > r.start, "n {n}: empty chunk");
                    assert_eq!(r.start % 4, 0, "n {n} chunk {chunk}: boundary {r:?}");
                    if n >= 16 {
                        assert!(r.len() >= 16, "n {n} chunk {chunk}: short chunk {r:?}");
                    }
                    if i + 1 < rs.len() {
                        assert!(r.len() <= chunk.max(16), "n {n}: chunk {r:?} too long");
                    }
                    next = r.end;
                }
                assert_eq!(next, n, "n {n} chunk {chunk}: covered");
            }
        }
        assert_eq!(
            ffn_chunks(300, 128).collect::<Vec<_>>(),
            [0..128, 128..256, 256..300]
        );
        assert_eq!(ffn_chunks(260, 128).collect::<Vec<_>>(), [0..128, 128..260]);
        assert_eq!(ffn_chunks(268, 128).collect::<Vec<_>>(), [0..128, 128..268]);
    }
}
