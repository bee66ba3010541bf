//! Mixture-of-experts feed-forward (Mixtral-style top-k routing; Qwen2-MoE / Qwen3-MoE with
//! an optional shared expert behind a sigmoid gate; Gemma 4's experts beside the layer's
//! dense MLP).
//!
//! Per token: router logits → softmax over all experts → the `top_k` most probable
//! (renormalized to sum 1 when `norm_topk`) → output = Σ_k p_k · s_k · expert_k(x) (`s` the
//! optional per-expert output scales, else 1), plus `sigmoid(x · g) · shared(x)` where there
//! is a shared expert. The batch is grouped by expert: each selected expert runs once on the
//! rows routed to it (gathered into one matrix), so only the selected experts' weights are
//! read. The experts' activation is the model's (SwiGLU, or GeGLU for Gemma 4).
//!
//! Gemma 4 ([`BranchNorms`]) reads the residual stream through three norms: the shared
//! expert (its dense MLP) the layer's feed-forward norm, the routed experts their own, the
//! router a weightless RMSNorm times a learned scale and `1/sqrt(n_embd)`; each branch's
//! output is normed before the two are added. (llama.cpp `src/models/gemma4.cpp`,
//! transformers `Gemma4TextDecoderLayer` and `Gemma4TextRouter`.)
//!
//! References: Shazeer et al., "Outrageously Large Neural Networks" (2017); Mixtral of
//! Experts (2024); transformers `Qwen2MoeSparseMoeBlock`.

use crate::weights::Linear;
use mica_kernels::matmul::QActs;
use mica_kernels::ops::rms_norm;
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
    /// gpt-oss's routing: the `top_k` largest router logits (the router's bias included),
    /// softmaxed among themselves (`norm_topk` then changes nothing).
    pub topk_softmax: bool,
    pub shared: Option<Expert>,
    /// `[1 × n_embd]`: the shared expert's output is scaled by `sigmoid(x · g)`.
    pub shared_gate: Option<Linear>,
    /// `[n_expert]` multiplies each routed expert's output (Gemma 4's `per_expert_scale`,
    /// llama.cpp's `ffn_down_exps.scale`).
    pub expert_scale: Option<Vec<f32>>,
    /// Gemma 4's own inputs of the router and the routed experts, and the norms of both
    /// branches' outputs; `None`: router and experts read the feed-forward norm's output and
    /// the branches are summed as they are.
    pub norms: Option<BranchNorms>,
    /// How scores are made and experts chosen beyond plain softmax top-k (DeepSeek).
    pub routing: Routing,
}

/// How a router's logits choose and weigh experts. The default is softmax top-k.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub scoring: Scoring,
    /// `[n_expert]` added to the scores only to choose experts (DeepSeek-V3's
    /// `e_score_correction_bias`, llama.cpp's `exp_probs_b`); the weights are the scores.
    pub choice_bias: Option<Vec<f32>>,
    /// Experts chosen only from the best groups.
    pub groups: Option<Groups>,
    /// Multiplies the routed experts' weights (`routed_scaling_factor`).
    pub scale: f32,
}

impl Default for Routing {
    fn default() -> Routing {
        Routing {
            scoring: Scoring::Softmax,
            choice_bias: None,
            groups: None,
            scale: 1.0,
        }
    }
}

/// How router logits become expert scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scoring {
    /// Probabilities over all experts.
    Softmax,
    /// Each expert's own `sigmoid(logit)` (DeepSeek-V3).
    Sigmoid,
}

/// Group-limited routing: the experts are `n_group` consecutive groups; only the
/// `topk_group` best groups (by [`GroupScore`]) are searched for the top-k experts.
#[derive(Clone, Debug, PartialEq)]
pub struct Groups {
    pub n_group: usize,
    pub topk_group: usize,
    pub score: GroupScore,
}

/// What ranks a group of experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupScore {
    /// Its best expert's score (transformers' DeepSeek-V2 `group_limited_greedy`).
    Max,
    /// The sum of its best two (DeepSeek-V3, and llama.cpp for every grouped model).
    TopTwoSum,
}

/// The indices of the `k` largest values, largest first; ties to the lower index (as
/// torch.topk on CPU).
fn top_indices(v: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..v.len()).collect();
    order.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
    order.truncate(k.min(v.len()));
    order
}

/// Gemma 4's norms around its two feed-forward branches (each `[n_embd]`).
pub struct BranchNorms {
    /// RMSNorm of the residual stream into the routed experts (`pre_feedforward_layernorm_2`,
    /// GGUF `pre_ffw_norm_2`).
    pub experts_in: Vec<f32>,
    /// The router's input: a weightless RMSNorm of the residual stream times `1/sqrt(n_embd)`
    /// times this (`router.scale`, GGUF `ffn_gate_inp.scale`).
    pub router_in: Vec<f32>,
    /// RMSNorm of the shared expert's (the dense MLP's) output (`post_feedforward_layernorm_1`,
    /// GGUF `post_ffw_norm_1`).
    pub shared_out: Vec<f32>,
    /// RMSNorm of the routed experts' sum (`post_feedforward_layernorm_2`, GGUF
    /// `post_ffw_norm_2`).
    pub experts_out: Vec<f32>,
}

/// What a mixture-of-experts block reads.
pub struct MoeInput<'a> {
    /// `[n, n_embd]` the residual stream entering the feed-forward sub-block.
    pub x: &'a [f32],
    /// `[n, n_embd]` `x` through the layer's feed-forward norm.
    pub xn: &'a [f32],
    /// Rows.
    pub n: usize,
    /// The gated activation in place: `gate = act(gate) * up`, with the model's numerics.
    pub glu: &'a dyn Fn(&mut [f32], &[f32]),
    /// The model's RMSNorm epsilon.
    pub eps: f32,
}

/// `y = W x` for `n` rows of `x` (`[n, cols]`) into `out` (`[n, rows]`).
pub(super) fn project(pool: &ThreadPool, lin: &Linear, x: &[f32], n: usize, out: &mut Vec<f32>) {
    let mut acts = QActs::new();
    acts.quantize(pool, lin.w.dtype.vec_dot_type(), x, n, lin.w.cols);
    out.resize(n * lin.out_dim(), 0.0);
    lin.forward(pool, &acts, out);
}

impl Expert {
    /// `out` (`[n, n_embd]`) = this expert on `x` (`[n, n_embd]`), `glu` its activation.
    fn forward(
        &self,
        pool: &ThreadPool,
        glu: &dyn Fn(&mut [f32], &[f32]),
        x: &[f32],
        n: usize,
        out: &mut Vec<f32>,
    ) {
        let (mut g, mut u) = (Vec::new(), Vec::new());
        // Gate and up read the same activations: quantized once when their types agree.
        let t = self.gate.w.dtype.vec_dot_type();
        let mut acts = QActs::new();
        acts.quantize(pool, t, x, n, self.gate.w.cols);
        g.resize(n * self.gate.out_dim(), 0.0);
        self.gate.forward(pool, &acts, &mut g);
        if self.up.w.dtype.vec_dot_type() == t {
            u.resize(n * self.up.out_dim(), 0.0);
            self.up.forward(pool, &acts, &mut u);
        } else {
            project(pool, &self.up, x, n, &mut u);
        }
        glu(&mut g, &u);
        project(pool, &self.down, &g, n, out);
    }
}

/// Each `w.len()`-wide row of `x` RMS-normalized with weight `w` into `out`.
fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut Vec<f32>) {
    out.resize(x.len(), 0.0);
    for (r, o) in x.chunks_exact(w.len()).zip(out.chunks_exact_mut(w.len())) {
        rms_norm(r, w, eps, o);
    }
}

impl Moe {
    /// The experts one token's router logits `row` select, with their weights.
    fn route(&self, row: &[f32]) -> Vec<(usize, f32)> {
        let n_exp = row.len();
        let r = &self.routing;
        // Scores: softmax probabilities (`e / z`, chosen by `e`), or independent sigmoids.
        let (scores, z): (Vec<f32>, f32) = match r.scoring {
            Scoring::Softmax => {
                let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = row.iter().map(|&v| (v - m).exp()).collect();
                let z: f32 = e.iter().sum();
                (e, z)
            }
            Scoring::Sigmoid => (row.iter().map(|&v| 1.0 / (1.0 + (-v).exp())).collect(), 1.0),
        };
        // What experts are chosen by: the scores plus the choice bias, outside the chosen
        // groups 0 (softmax, as DeepSeek-V2) or -inf (sigmoid, as DeepSeek-V3).
        let mut choice = scores.clone();
        let mut masked = vec![false; n_exp];
        if let Some(b) = &r.choice_bias {
            choice.iter_mut().zip(b).for_each(|(c, b)| *c += b);
        }
        if let Some(g) = r.groups.as_ref().filter(|g| g.n_group > 1) {
            let per = n_exp / g.n_group;
            let score = |grp: &[f32]| match g.score {
                GroupScore::Max => grp.iter().copied().fold(f32::NEG_INFINITY, f32::max),
                GroupScore::TopTwoSum => {
                    let mut v = grp.to_vec();
                    v.sort_by(|a, b| b.total_cmp(a));
                    v.iter().take(2).sum()
                }
            };
            let gs: Vec<f32> = choice.chunks(per).map(score).collect();
            let kept = top_indices(&gs, g.topk_group);
            let off = match r.scoring {
                Scoring::Softmax => 0.0,
                Scoring::Sigmoid => f32::NEG_INFINITY,
            };
            for (i, c) in choice.iter_mut().enumerate() {
                if !kept.contains(&(i / per)) {
                    *c = off;
                    masked[i] = true;
                }
            }
        }
        let top = top_indices(&choice, self.top_k);
        // A softmax expert outside the chosen groups weighs 0 (it was picked among zeros).
        let mut w: Vec<f32> = top
            .iter()
            .map(|&i| match r.scoring {
                Scoring::Softmax if masked[i] => 0.0,
                Scoring::Softmax => scores[i] / z,
                Scoring::Sigmoid => scores[i],
            })
            .collect();
        if self.norm_topk {
            let s: f32 = w.iter().sum();
            let s = match r.scoring {
                Scoring::Softmax => s,
                Scoring::Sigmoid => s + 1e-20,
            };
            w.iter_mut().for_each(|v| *v /= s);
        }
        if r.scale != 1.0 {
            w.iter_mut().for_each(|v| *v *= r.scale);
        }
        top.into_iter().zip(w).collect()
    }

    /// `out` (`[n, d]`) = the block on `input`.
    pub fn forward(&self, pool: &ThreadPool, input: &MoeInput<'_>, d: usize, out: &mut [f32]) {
        let (n, glu, eps) = (input.n, input.glu, input.eps);
        let n_exp = self.experts.len();
        // The router's and the routed experts' inputs.
        let (mut router_x, mut experts_x) = (Vec::new(), Vec::new());
        let (router_x, x) = match &self.norms {
            None => (&input.xn[..n * d], &input.xn[..n * d]),
            Some(nm) => {
                let x = &input.x[..n * d];
                // As llama.cpp: the weightless norm, scaled by 1/sqrt(d), times the scale.
                norm_rows(x, &vec![1.0; d], eps, &mut router_x);
                ops::scale(&mut router_x, 1.0 / (d as f32).sqrt());
                for row in router_x.chunks_exact_mut(d) {
                    row.iter_mut().zip(&nm.router_in).for_each(|(v, s)| *v *= s);
                }
                norm_rows(x, &nm.experts_in, eps, &mut experts_x);
                (&router_x[..], &experts_x[..])
            }
        };
        // `[n, n_expert]` router logits, then per token the selected (expert, weight).
        let mut logits = Vec::new();
        project(pool, &self.router, router_x, n, &mut logits);
        // `[n_expert]` lists of (token, weight).
        let mut routed: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n_exp];
        for t in 0..n {
            let row = &logits[t * n_exp..(t + 1) * n_exp];
            if self.topk_softmax {
                let mut order: Vec<usize> = (0..n_exp).collect();
                // Largest first; ties to the lower index.
                order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
                let top = &order[..self.top_k.min(n_exp)];
                let m = row[top[0]];
                let e: Vec<f32> = top.iter().map(|&i| (row[i] - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for (&i, &p) in top.iter().zip(&e) {
                    routed[i].push((t, p / z));
                }
                continue;
            }
            for (i, p) in self.route(row) {
                routed[i].push((t, p));
            }
        }
        out[..n * d].fill(0.0);
        let (mut xg, mut y) = (Vec::new(), Vec::new());
        for (e, (expert, rows)) in self.experts.iter().zip(&routed).enumerate() {
            if rows.is_empty() {
                continue;
            }
            // `[m, d]` the rows routed to this expert.
            xg.clear();
            for &(t, _) in rows {
                xg.extend_from_slice(&x[t * d..(t + 1) * d]);
            }
            expert.forward(pool, glu, &xg, rows.len(), &mut y);
            if let Some(s) = self.expert_scale.as_ref().map(|s| s[e]) {
                ops::scale(&mut y[..rows.len() * d], s);
            }
            for (k, &(t, p)) in rows.iter().enumerate() {
                for (o, &v) in out[t * d..(t + 1) * d]
                    .iter_mut()
                    .zip(&y[k * d..(k + 1) * d])
                {
                    *o += p * v;
                }
            }
        }
        if let Some(nm) = &self.norms {
            let mut t = Vec::new();
            norm_rows(&out[..n * d], &nm.experts_out, eps, &mut t);
            out[..n * d].copy_from_slice(&t);
        }
        if let Some(shared) = &self.shared {
            // The shared expert reads the feed-forward norm's output.
            let xn = &input.xn[..n * d];
            shared.forward(pool, glu, xn, n, &mut y);
            if let Some(nm) = &self.norms {
                let mut t = Vec::new();
                norm_rows(&y[..n * d], &nm.shared_out, eps, &mut t);
                y = t;
            }
            let mut g = Vec::new();
            if let Some(gate) = &self.shared_gate {
                project(pool, gate, xn, n, &mut g);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::Matrix;

    fn lin(name: &str, rows: usize, cols: usize, f: impl Fn(usize) -> f32) -> Linear {
        let v: Vec<f32> = (0..rows * cols).map(f).collect();
        Linear::new(Matrix::from_f32(name, rows, cols, &v), None)
    }

    fn swiglu(g: &mut [f32], u: &[f32]) {
        ops::swiglu(g, u);
    }

    /// `x` as both the residual stream and its normed copy, with SwiGLU.
    fn input(x: &[f32], n: usize) -> MoeInput<'_> {
        MoeInput {
            x,
            xn: x,
            n,
            glu: &swiglu,
            eps: 1e-6,
        }
    }

    fn expert(seed: usize, d: usize, ff: usize, poison: bool) -> Expert {
        let val = move |i: usize| {
            if poison {
                f32::NAN
            } else {
                (((i * 7 + seed * 13) % 11) as f32 - 5.0) * 0.05
            }
        };
        Expert {
            gate: lin("gate", ff, d, val),
            up: lin("up", ff, d, move |i| val(i + 3)),
            down: lin("down", d, ff, move |i| val(i + 5)),
        }
    }

    /// Expert 3's weights are NaN and the router never picks it (its logit is always far
    /// below): the output stays finite, so the expert was never computed. A batch, grouped by
    /// expert, gives each token what it gets alone.
    #[test]
    fn unselected_experts_are_not_computed_and_batches_group_by_expert() {
        let (d, ff, n_exp) = (8, 4, 4);
        // Router rows: experts 0-2 depend on the input, expert 3 is -100 · (sum of inputs
        // that are all positive).
        let router = lin("router", n_exp, d, |i| {
            let (e, c) = (i / d, i % d);
            if e == 3 {
                -100.0
            } else {
                ((e * 5 + c * 3) % 7) as f32 * 0.1 - 0.3
            }
        });
        let moe = Moe {
            router,
            experts: (0..n_exp).map(|e| expert(e, d, ff, e == 3)).collect(),
            top_k: 2,
            norm_topk: true,
            topk_softmax: false,
            shared: Some(expert(9, d, ff, false)),
            shared_gate: Some(lin("shared_gate", 1, d, |c| 0.2 - 0.05 * c as f32)),
            expert_scale: None,
            norms: None,
            routing: Routing::default(),
        };
        let pool = ThreadPool::new(1);
        let n = 5;
        let x: Vec<f32> = (0..n * d)
            .map(|i| 0.1 + ((i * 3) % 5) as f32 * 0.2)
            .collect();
        let mut batch = vec![0f32; n * d];
        moe.forward(&pool, &input(&x, n), d, &mut batch);
        assert!(
            batch.iter().all(|v| v.is_finite()),
            "a NaN expert was computed"
        );
        for t in 0..n {
            let mut one = vec![0f32; d];
            moe.forward(&pool, &input(&x[t * d..(t + 1) * d], 1), d, &mut one);
            for (a, b) in one.iter().zip(&batch[t * d..(t + 1) * d]) {
                assert!(
                    (a - b).abs() <= 1e-6,
                    "token {t}: alone {a}, in the batch {b}"
                );
            }
        }
        assert!(
            batch.iter().any(|&v| v.abs() > 1e-3),
            "output is not trivially zero"
        );
    }

    /// Gemma 4's wiring: the router and the routed experts read the residual stream through
    /// their own norms, never the feed-forward norm's output, which only the shared expert
    /// (the layer's MLP) reads. With that output poisoned the block stays finite until a
    /// shared expert is added; batches still group by expert.
    #[test]
    fn branch_norms_read_the_residual_stream_and_only_the_shared_expert_reads_xn() {
        let (d, ff, n_exp) = (8, 4, 4);
        let norm = |k: usize| (0..d).map(|c| 0.5 + ((c + k) % 3) as f32 * 0.25).collect();
        let mut moe = Moe {
            router: lin("router", n_exp, d, |i| ((i * 5) % 7) as f32 * 0.1 - 0.3),
            experts: (0..n_exp).map(|e| expert(e, d, ff, false)).collect(),
            top_k: 2,
            norm_topk: true,
            topk_softmax: false,
            shared: None,
            shared_gate: None,
            expert_scale: Some(vec![0.5, 1.0, 1.5, 2.0]),
            norms: Some(BranchNorms {
                experts_in: norm(0),
                router_in: norm(1),
                shared_out: norm(2),
                experts_out: norm(3),
            }),
            routing: Routing::default(),
        };
        let pool = ThreadPool::new(1);
        let n = 5;
        let x: Vec<f32> = (0..n * d)
            .map(|i| 0.1 + ((i * 3) % 5) as f32 * 0.2 - 0.3)
            .collect();
        let poisoned = vec![f32::NAN; n * d];
        let run = |moe: &Moe, x: &[f32], xn: &[f32], n: usize| {
            let mut out = vec![0f32; n * d];
            let input = MoeInput {
                x,
                xn,
                n,
                glu: &swiglu,
                eps: 1e-6,
            };
            moe.forward(&pool, &input, d, &mut out);
            out
        };
        let batch = run(&moe, &x, &poisoned, n);
        assert!(
            batch.iter().all(|v| v.is_finite()),
            "router or experts read xn"
        );
        for t in 0..n {
            let one = run(&moe, &x[t * d..(t + 1) * d], &poisoned[..d], 1);
            for (a, b) in one.iter().zip(&batch[t * d..(t + 1) * d]) {
                assert!(
                    (a - b).abs() <= 1e-6,
                    "token {t}: alone {a}, in the batch {b}"
                );
            }
        }
        moe.shared = Some(expert(9, d, ff, false));
        assert!(
            run(&moe, &x, &poisoned, n).iter().all(|v| v.is_nan()),
            "the shared expert does not read xn"
        );
    }

    /// DeepSeek's routing rules on one token: a group ranked by its best expert (V2) or its
    /// best two (V3, llama.cpp) picks different experts; sigmoid scores are chosen by score +
    /// bias but weighed by the score, renormalized and scaled.
    #[test]
    fn grouped_and_biased_routing() {
        let (d, ff) = (4, 2);
        let mut moe = Moe {
            router: lin("router", 4, d, |_| 0.0),
            experts: (0..4).map(|e| expert(e, d, ff, false)).collect(),
            top_k: 2,
            norm_topk: false,
            topk_softmax: false,
            shared: None,
            shared_gate: None,
            expert_scale: None,
            norms: None,
            routing: Routing {
                scale: 1.5,
                groups: Some(Groups {
                    n_group: 2,
                    topk_group: 1,
                    score: GroupScore::Max,
                }),
                ..Routing::default()
            },
        };
        // Softmax: group 0 holds the best expert, group 1 the best pair.
        let row = [2.0, -3.0, 1.5, 1.4];
        let e: Vec<f32> = row.iter().map(|&v: &f32| (v - 2.0).exp()).collect();
        let z: f32 = e.iter().sum();
        let picked = moe.route(&row);
        assert_eq!(picked, vec![(0, e[0] / z * 1.5), (1, e[1] / z * 1.5)]);
        moe.routing.groups.as_mut().unwrap().score = GroupScore::TopTwoSum;
        let picked: Vec<usize> = moe.route(&row).iter().map(|p| p.0).collect();
        assert_eq!(picked, vec![2, 3]);
        // Sigmoid: equal scores, the bias decides; weights are the scores, renormalized.
        moe.routing = Routing {
            scoring: Scoring::Sigmoid,
            choice_bias: Some(vec![0.0, 1.0, 0.0, 2.0]),
            groups: None,
            scale: 2.0,
        };
        moe.norm_topk = true;
        assert_eq!(moe.route(&[0.0; 4]), vec![(3, 1.0), (1, 1.0)]);
    }
}
