//! Which layers go on the GPU, and whether they fit: llama.cpp's `-ngl N` offloads the last
//! `N` layers (and, with them, the output head); [`plan`] sizes what that puts in device
//! memory — the layers' weights as stored, the head, their paged KV cache and one step's
//! buffers — and refuses a placement that does not fit, naming the sizes and the largest
//! layer count that would.

use crate::ops::kv_block_bytes;
use crate::{GpuError, Result};
use mica_models::Model;
use mica_models::model::{DecoderLayer, Ffn};
use mica_models::weights::Linear;
use std::fmt;
use std::str::FromStr;

/// How many layers run on the GPU: `all`, or the last `N` (more than the model has: all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuLayers {
    All,
    Last(usize),
}

impl GpuLayers {
    /// The first offloaded layer of an `n_layer`-layer model.
    pub fn first(self, n_layer: usize) -> usize {
        match self {
            GpuLayers::All => 0,
            GpuLayers::Last(n) => n_layer.saturating_sub(n),
        }
    }
}

impl FromStr for GpuLayers {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim() {
            "all" | "-1" => Ok(GpuLayers::All),
            n => n
                .parse()
                .map(GpuLayers::Last)
                .map_err(|_| format!("--gpu-layers takes a number of layers or `all`, not {s:?}")),
        }
    }
}

impl fmt::Display for GpuLayers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuLayers::All => f.write_str("all"),
            GpuLayers::Last(n) => write!(f, "{n}"),
        }
    }
}

/// What offloading layers `first..` puts in device memory, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub first: usize,
    pub n_layer: usize,
    /// The layers' weights, the output head (and the embedding when it is needed there).
    pub weights: usize,
    /// The layers' paged key/value caches.
    pub kv: usize,
    /// One step's activations.
    pub scratch: usize,
}

impl Placement {
    pub fn total(&self) -> usize {
        self.weights + self.kv + self.scratch
    }
}

/// Device memory kept free beside a placement: 1/20 of what is free, at least 64 MiB (the
/// allocator's rounding, the driver's own buffers).
pub fn headroom(free: usize) -> usize {
    (free / 20).max(64 << 20)
}

fn linear_bytes(l: &Linear) -> usize {
    l.w.view().data.len() + 4 * l.bias.as_ref().map_or(0, Vec::len)
}

fn vec_bytes(v: &Option<Vec<f32>>) -> usize {
    4 * v.as_ref().map_or(0, Vec::len)
}

/// Weight bytes of one layer on the device (as `GpuDecoder` uploads it).
fn layer_bytes(layer: &DecoderLayer) -> usize {
    let mut b = 4 * (layer.attn_norm.len() + layer.ffn_norm.len());
    for v in [
        &layer.q_norm,
        &layer.k_norm,
        &layer.v_norm,
        &layer.post_attn_norm,
        &layer.post_ffn_norm,
    ] {
        b += vec_bytes(v);
    }
    b += linear_bytes(&layer.wq) + linear_bytes(&layer.wo);
    b += layer.wk.as_ref().map_or(0, linear_bytes) + layer.wv.as_ref().map_or(0, linear_bytes);
    if let Ffn::Dense(e) = &layer.ffn {
        b += linear_bytes(&e.gate) + linear_bytes(&e.up) + linear_bytes(&e.down);
    }
    b
}

/// The device bytes of layers `first..` and the head of `model`, with `n_blocks` KV blocks
/// per layer and steps of up to `max_tokens` tokens.
pub fn footprint(model: &Model, first: usize, n_blocks: usize, max_tokens: usize) -> Placement {
    let cfg = &model.config;
    let n_layer = model.layers.len();
    let first = first.min(n_layer);
    let tied = model.output.w.name == model.tok_embd.name && model.output.bias.is_none();
    let mut weights: usize = model.layers[first..].iter().map(layer_bytes).sum();
    // Each layer's RoPE frequency factors.
    weights += (first..n_layer)
        .filter_map(|l| cfg.rope_of(l))
        .map(|r| vec_bytes(&r.freq_factors))
        .sum::<usize>();
    if cfg.final_norm {
        weights += 4 * model.output_norm.len();
    }
    if !tied {
        weights += linear_bytes(&model.output);
    }
    if tied || first == 0 {
        weights += model.tok_embd.view().data.len();
    }
    let kv = (first..n_layer)
        .map(|l| n_blocks * kv_block_bytes(cfg.n_head_kv_of(l), cfg.head_dim_of(l)))
        .sum();
    let layers = first..n_layer;
    let qd = layers.clone().map(|l| cfg.q_dim_of(l)).max().unwrap_or(0);
    let kvd = layers.clone().map(|l| cfg.kv_dim_of(l)).max().unwrap_or(0);
    let ff = model.layers[first..]
        .iter()
        .filter_map(|l| match &l.ffn {
            Ffn::Dense(e) => Some(e.gate.w.rows),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    // x, xn, proj, the head's rows; q, attention; k, v; gate, up; the logits.
    let per_token = 4 * cfg.n_embd + 2 * qd + 2 * kvd + 2 * ff + cfg.n_vocab;
    // Token ids, positions and block-table offsets, and the tables (every block at most).
    let scratch = max_tokens * (4 * per_token + 12) + 4 * n_blocks;
    Placement {
        first,
        n_layer,
        weights,
        kv,
        scratch,
    }
}

fn mib(b: usize) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

/// The placement of `layers` for `model` (see [`footprint`]), or an error saying what it
/// needs against `free` device bytes and how many layers would fit.
pub fn plan(
    model: &Model,
    layers: GpuLayers,
    n_blocks: usize,
    max_tokens: usize,
    free: usize,
) -> Result<Placement> {
    let n_layer = model.layers.len();
    let p = footprint(model, layers.first(n_layer), n_blocks, max_tokens);
    let room = free.saturating_sub(headroom(free));
    if p.total() <= room {
        return Ok(p);
    }
    // The most layers that fit (fewer layers: less of everything).
    let fits = (0..=n_layer)
        .rev()
        .find(|&n| footprint(model, n_layer - n, n_blocks, max_tokens).total() <= room);
    let hint = match fits {
        Some(n) => format!("--gpu-layers {n} fits"),
        None => "not even the output head alone fits; use a smaller KV cache or none".into(),
    };
    Err(GpuError::OutOfMemory(format!(
        "layers {}..{n_layer} ({} of {n_layer}) and the output head need {} on the GPU (weights {}, KV cache {}, step buffers {}) but {} of {} free may be used: {hint}",
        p.first,
        n_layer - p.first,
        mib(p.total()),
        mib(p.weights),
        mib(p.kv),
        mib(p.scratch),
        mib(room),
        mib(free),
    )))
}
