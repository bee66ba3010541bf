//! `--mix BPW`: a type per tensor, chosen to meet an average bits-per-weight budget with the
//! least estimated loss.
//!
//! **Sensitivity.** For a weight matrix `W` whose inputs have mean squared activation
//! `a_c` per column `c` (the importance matrix; 1 without one), quantizing it alone to type
//! `q` adds to its output, per token, an expected squared error of
//! `E‖(W − Ŵ_q) x‖² ≈ Σ_rows Σ_c a_c (W − Ŵ_q)²_{r,c}` (the diagonal approximation that
//! imatrix quantization itself minimizes). That is measured for every candidate type by
//! quantizing (with the importance-weighted quantizers) and dequantizing a sample of up to
//! [`SAMPLE_ROWS`] evenly spaced rows, scaled to the whole matrix.
//!
//! **Choice.** Every mixable tensor (each one llama.cpp's rules would quantize) starts at
//! its cheapest candidate; then, greedily, the upgrade (tensor, higher type) with the
//! largest loss reduction per extra bit that still fits the budget is taken, until none
//! fits or helps — the classic greedy for a multiple-choice knapsack over convex loss/size
//! curves. The budget counts every tensor of the file (norms included): average BPW =
//! total tensor bits / total weights, which is what a file's size says.
//!
//! Candidates: Q3_K, Q4_K, Q5_K, Q6_K (rows a multiple of 256), Q4_0, Q4_1, Q5_0, Q5_1
//! (rows a multiple of 32), Q8_0.

use super::Planned;
use super::kl::KlProbe;
use super::source::Source;
use crate::error::{QuantError, Result};
use crate::imatrix::Imatrix;
use crate::progress::{Event, Task};
use mica_formats::ggml_types::GgmlType;
use mica_kernels::DType;
use mica_kernels::quant::weighted::quantize_row_weighted;
use mica_kernels::quant::{dequantize_row, quantize_row};

/// Rows sampled per tensor to estimate its loss.
pub const SAMPLE_ROWS: usize = 48;

const CANDIDATES: &[DType] = &[
    DType::Q3_K,
    DType::Q4_0,
    DType::Q4_K,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_K,
    DType::Q5_1,
    DType::Q6_K,
    DType::Q8_0,
];

/// The types a mix chose, and how.
#[derive(Clone, Debug, PartialEq)]
pub struct MixReport {
    /// The budget asked for, and the average bits per weight achieved (both over every
    /// tensor of the file).
    pub budget: f64,
    pub bpw: f64,
    /// Each mixed tensor's type and estimated loss (KL-divergence in nats when measured),
    /// in file order.
    pub tensors: Vec<MixedTensor>,
    /// With a KL probe: tensors measured and the seconds it took.
    pub measured: Option<(usize, f64)>,
    /// Tensors the probe could not measure alone (they take the median sensitivity).
    pub unmeasured: usize,
}

impl MixReport {
    /// The sum of the mixed tensors' estimated losses.
    pub fn total_loss(&self) -> f64 {
        self.tensors.iter().map(|t| t.loss).sum()
    }
}

/// One tensor of a mix.
#[derive(Clone, Debug, PartialEq)]
pub struct MixedTensor {
    pub name: String,
    pub ty: GgmlType,
    pub loss: f64,
}

/// One mixable tensor: its candidates (cheapest first) with (bits, estimated loss).
struct Options {
    planned: usize,
    choices: Vec<(DType, f64, f64)>,
}

/// Bits of a tensor of `shape` in `t`.
fn bits(t: GgmlType, shape: &[u64]) -> f64 {
    t.n_bytes(shape).unwrap_or(0) as f64 * 8.0
}

/// Estimated output error of tensor `p` in each candidate type.
fn options(src: &Source, p: &Planned, imatrix: Option<&Imatrix>, idx: usize) -> Result<Options> {
    let name = &p.info.name;
    let from = p.info.dtype().ok_or_else(|| QuantError::UnreadableType {
        tensor: name.clone(),
    })?;
    let row_len = p.info.row_len() as usize;
    let n_rows = p.info.n_rows() as usize;
    let in_row = from
        .row_bytes(row_len)
        .ok_or_else(|| QuantError::BadRowLength {
            tensor: name.clone(),
        })?;
    let imp = imatrix
        .and_then(|m| m.weights(name))
        .filter(|w| w.len() == row_len);
    let data = src.data(p.idx)?;
    let step = n_rows.div_ceil(SAMPLE_ROWS).max(1);
    let rows: Vec<usize> = (0..n_rows).step_by(step).collect();
    let mut x = vec![0f32; row_len];
    let mut y = vec![0f32; row_len];
    let mut choices = Vec::new();
    for &t in CANDIDATES {
        let Some(out_row) = t.row_bytes(row_len) else {
            continue;
        };
        let mut q = vec![0u8; out_row];
        let mut err = 0f64;
        for &r in &rows {
            dequantize_row(from, &data[r * in_row..(r + 1) * in_row], &mut x);
            match &imp {
                Some(w) => quantize_row_weighted(t, &x, w, &mut q),
                None => quantize_row(t, &x, &mut q),
            }
            dequantize_row(t, &q, &mut y);
            for c in 0..row_len {
                let d = (x[c] - y[c]) as f64;
                err += imp.as_ref().map_or(1.0, |w| w[c] as f64) * d * d;
            }
        }
        let loss = err * n_rows as f64 / rows.len() as f64;
        choices.push((t, bits(GgmlType(t.ggml_id()), &p.info.shape), loss));
    }
    if choices.is_empty() {
        return Err(QuantError::NoMixCandidate {
            tensor: name.clone(),
            row_len,
        });
    }
    choices.sort_by(|a, b| a.1.total_cmp(&b.1));
    // Keep only choices that lower the loss as bits grow (the lower convex-ish frontier).
    let mut frontier: Vec<(DType, f64, f64)> = Vec::new();
    for c in choices {
        if frontier.last().is_none_or(|l| c.2 < l.2) {
            frontier.push(c);
        }
    }
    Ok(Options {
        planned: idx,
        choices: frontier,
    })
}

/// Chooses the types of the mixable tensors of `planned` (indices into it) for an average
/// of `bpw` bits per weight over the whole file, measuring sensitivities with `probe` when
/// given.
pub(crate) fn choose(
    src: &Source,
    planned: &mut [Planned],
    mixable: &[usize],
    imatrix: Option<&Imatrix>,
    bpw: f64,
    threads: usize,
    probe: Option<&mut KlProbe>,
    on_event: &mut dyn FnMut(Event),
) -> Result<MixReport> {
    let n_weights: f64 = planned.iter().map(|p| p.info.n_elements() as f64).sum();
    let budget = bpw * n_weights;
    let fixed: f64 = planned
        .iter()
        .enumerate()
        .filter(|(i, _)| !mixable.contains(i))
        .map(|(_, p)| bits(p.target, &p.info.shape))
        .sum();

    // Sensitivities, tensors spread over the threads.
    let per = mixable.len().div_ceil(threads.max(1)).max(1);
    let planned_ref: &[Planned] = planned;
    let results: Vec<Result<Vec<Options>>> = std::thread::scope(|s| {
        let handles: Vec<_> = mixable
            .chunks(per)
            .map(|chunk| {
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|&i| options(src, &planned_ref[i], imatrix, i))
                        .collect::<Result<Vec<_>>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(QuantError::ThreadPanicked)))
            .collect()
    });
    let mut opts = Vec::new();
    for r in results {
        opts.extend(r?);
    }
    let (measured, unmeasured) = match probe {
        Some(probe) => {
            let (n, secs, missing) = calibrate(probe, planned, &mut opts, imatrix, on_event)?;
            (Some((n, secs)), missing)
        }
        None => (None, 0),
    };

    let mut at = vec![0usize; opts.len()];
    let mut total = fixed + opts.iter().map(|o| o.choices[0].1).sum::<f64>();
    if total > budget {
        return Err(QuantError::MixTooSmall {
            bpw,
            smallest: total / n_weights,
        });
    }
    loop {
        let mut best: Option<(usize, usize, f64)> = None;
        for (k, o) in opts.iter().enumerate() {
            let (_, b0, l0) = o.choices[at[k]];
            for (j, &(_, b, l)) in o.choices.iter().enumerate().skip(at[k] + 1) {
                let extra = b - b0;
                if total + extra > budget || l >= l0 {
                    continue;
                }
                let gain = (l0 - l) / extra;
                if best.is_none_or(|(_, _, g)| gain > g) {
                    best = Some((k, j, gain));
                }
            }
        }
        let Some((k, j, _)) = best else { break };
        total += opts[k].choices[j].1 - opts[k].choices[at[k]].1;
        at[k] = j;
    }
    let mut tensors = Vec::with_capacity(opts.len());
    for (k, o) in opts.iter().enumerate() {
        let (t, _, loss) = o.choices[at[k]];
        let p = &mut planned[o.planned];
        p.target = GgmlType(t.ggml_id());
        tensors.push(MixedTensor {
            name: p.info.name.clone(),
            ty: p.target,
            loss,
        });
    }
    Ok(MixReport {
        budget: bpw,
        bpw: total / n_weights,
        tensors,
        measured,
        unmeasured,
    })
}

/// Puts the tensors' estimated losses on one scale: each tensor's output error measures how
/// much its own product changes, not how much the model's predictions do, which depends on
/// where the tensor sits (an early attention key moves everything after it; the last FFN
/// little). So each tensor is quantized alone to its cheapest candidate and the model's
/// KL-divergence from the unquantized model measured ([`KlProbe`]); the ratio of that to the
/// tensor's estimated error scales all its candidates' losses. Tensors the probe cannot
/// replace take the median ratio. Returns the tensors measured, the seconds it took, and
/// how many could not be measured.
fn calibrate(
    probe: &mut KlProbe,
    planned: &[Planned],
    opts: &mut [Options],
    imatrix: Option<&Imatrix>,
    on_event: &mut dyn FnMut(Event),
) -> Result<(usize, f64, usize)> {
    on_event(Event::Start {
        task: Task::Sensitivity,
        total: opts.len() as u64,
    });
    let t0 = std::time::Instant::now();
    let mut gains: Vec<Option<f64>> = Vec::with_capacity(opts.len());
    for o in opts.iter() {
        let name = &planned[o.planned].info.name;
        on_event(Event::Item(name.clone()));
        let (t, _, loss) = o.choices[0];
        let gain = if loss > 0.0 {
            let imp = imatrix.and_then(|m| m.weights(name));
            probe.kl_with(name, t, imp.as_deref())?.map(|kl| kl / loss)
        } else {
            Some(0.0)
        };
        gains.push(gain);
        on_event(Event::Advance(1));
    }
    on_event(Event::Finish);
    let secs = t0.elapsed().as_secs_f64();
    let mut known: Vec<f64> = gains
        .iter()
        .flatten()
        .copied()
        .filter(|g| *g > 0.0)
        .collect();
    known.sort_by(f64::total_cmp);
    let median = known.get(known.len() / 2).copied().unwrap_or(1.0);
    let missing = gains.iter().filter(|g| g.is_none()).count();
    for (o, g) in opts.iter_mut().zip(gains) {
        let g = g.unwrap_or(median);
        for c in &mut o.choices {
            c.2 *= g;
        }
    }
    Ok((opts.len(), secs, missing))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_cheapest_first_by_block_fit() {
        // 576-wide rows (SmolLM2) have no k-quant candidates.
        let fits: Vec<DType> = CANDIDATES
            .iter()
            .copied()
            .filter(|t| t.row_bytes(576).is_some())
            .collect();
        assert!(!fits.contains(&DType::Q4_K) && fits.contains(&DType::Q4_0));
        assert!(CANDIDATES.iter().all(|t| t.row_bytes(1536).is_some()));
    }
}
