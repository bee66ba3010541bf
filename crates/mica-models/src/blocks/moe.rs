//! Mixture-of-experts feed-forward (Mixtral-style top-k routing; Qwen2-MoE / Qwen3-MoE with
//! an optional shared expert behind a sigmoid gate).
//!
//! Per token: router logits → softmax over all experts → the `top_k` most probable
//! (renormalized to sum 1 when `norm_topk`) → output = Σ_k p_k · expert_k(x), plus
//! `sigmoid(x · g) · shared(x)` where there is a shared expert. The batch is grouped by
//! expert: each selected expert runs once on the rows routed to it (gathered into one
//! matrix), so only the selected experts' weights are read.
//!
//! References: Shazeer et al., "Outrageously Large Neural Networks" (2017); Mixtral of
//! Experts (2024); transformers `Qwen2MoeSparseMoeBlock`.

use crate::weights::Linear;
use mica_kernels::matmul::QActs;
use mica_kernels::{ThreadPool, ops};

/// One gated expert: `down(silu(gate(x)) * up(x))`.
pub struct Expert {
    /// `[n_ff_exp × n_embd]`
    pub gate: Linear,
    /// `[n_ff_exp × n_embd]`
    pub up: Linear,
    /// `[n_embd × n_ff_exp]`
    pub down: Linear,
}

/// A mixture-of-experts block.
pub struct Moe {
    /// `[n_expert × n_embd]`
    pub router: Linear,
    pub experts: Vec<Expert>,
    pub top_k: usize,
    /// Renormalize the selected probabilities to sum to 1 (Mixtral; Qwen MoE when
    /// `norm_topk_prob`).
    pub norm_topk: bool,
    pub shared: Option<Expert>,
    /// `[1 × n_embd]`: the shared expert's output is scaled by `sigmoid(x · g)`.
    pub shared_gate: Option<Linear>,
}

/// `y = W x` for `n` rows of `x` (`[n, cols]`) into `out` (`[n, rows]`).
fn project(pool: &ThreadPool, lin: &Linear, x: &[f32], n: usize, out: &mut Vec<f32>) {
    let mut acts = QActs::new();
    acts.quantize(pool, lin.w.dtype.vec_dot_type(), x, n, lin.w.cols);
    out.resize(n * lin.out_dim(), 0.0);
    lin.forward(pool, &acts, out);
}

impl Expert {
    /// `out` (`[n, n_embd]`) = this expert on `x` (`[n, n_embd]`).
    fn forward(&self, pool: &ThreadPool, x: &[f32], n: usize, out: &mut Vec<f32>) {
        let (mut g, mut u) = (Vec::new(), Vec::new());
        project(pool, &self.gate, x, n, &mut g);
        project(pool, &self.up, x, n, &mut u);
        ops::swiglu(&mut g, &u);
        project(pool, &self.down, &g, n, out);
    }
}

impl Moe {
    /// `out` (`[n, d]`) = the block on `x` (`[n, d]`).
    pub fn forward(&self, pool: &ThreadPool, x: &[f32], n: usize, d: usize, out: &mut [f32]) {
        let n_exp = self.experts.len();
        // `[n, n_expert]` router logits, then per token the selected (expert, weight).
        let mut logits = Vec::new();
        project(pool, &self.router, x, n, &mut logits);
        // `[n_expert]` lists of (token, weight).
        let mut routed: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n_exp];
        for t in 0..n {
            let row = &logits[t * n_exp..(t + 1) * n_exp];
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = row.iter().map(|&v| (v - m).exp()).collect();
            let z: f32 = e.iter().sum();
            let mut order: Vec<usize> = (0..n_exp).collect();
            // Most probable first; ties to the lower index (as torch.topk on CPU).
            order.sort_by(|&a, &b| e[b].total_cmp(&e[a]).then(a.cmp(&b)));
            let top = &order[..self.top_k.min(n_exp)];
            let mut w: Vec<f32> = top.iter().map(|&i| e[i] / z).collect();
            if self.norm_topk {
                let s: f32 = w.iter().sum();
                w.iter_mut().for_each(|v| *v /= s);
            }
            for (&i, &p) in top.iter().zip(&w) {
                routed[i].push((t, p));
            }
        }
        out[..n * d].fill(0.0);
        let (mut xg, mut y) = (Vec::new(), Vec::new());
        for (expert, rows) in self.experts.iter().zip(&routed) {
            if rows.is_empty() {
                continue;
            }
            // `[m, d]` the rows routed to this expert.
            xg.clear();
            for &(t, _) in rows {
                xg.extend_from_slice(&x[t * d..(t + 1) * d]);
            }
            expert.forward(pool, &xg, rows.len(), &mut y);
            for (k, &(t, p)) in rows.iter().enumerate() {
                for (o, &v) in out[t * d..(t + 1) * d]
                    .iter_mut()
                    .zip(&y[k * d..(k + 1) * d])
                {
                    *o += p * v;
                }
            }
        }
        if let Some(shared) = &self.shared {
            shared.forward(pool, &x[..n * d], n, &mut y);
            let mut g = Vec::new();
            if let Some(gate) = &self.shared_gate {
                project(pool, gate, x, n, &mut g);
            }
            for t in 0..n {
                let s = g.get(t).map_or(1.0, |&v| 1.0 / (1.0 + (-v).exp()));
                for (o, &v) in out[t * d..(t + 1) * d]
                    .iter_mut()
                    .zip(&y[t * d..(t + 1) * d])
                {
                    *o += s * v;
                }
            }
        }
    }
}
