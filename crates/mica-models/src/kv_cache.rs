//! The key/value cache, addressed by sequence (ARCHITECTURE decision 1).
//!
//! Each sequence owns, per layer, keys and values for positions `0..len` stored as f16 (as
//! llama.cpp's default cache does), laid out `[n_ctx][n_head_kv * head_dim]` so one key of
//! one head is a contiguous run of `head_dim` values. Storage for a sequence is allocated when
//! it is first used. A paged, shared cache replaces the storage behind this interface later;
//! the forward pass only asks for a sequence's length, writes new rows and reads old ones.

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use half::f16;

/// Identifies a sequence in the cache and in a [`crate::Batch`].
pub type SeqId = usize;

struct SeqCache {
    len: usize,
    /// `[n_layer][n_ctx * kv_dim]`
    k: Vec<Vec<f16>>,
    /// `[n_layer][n_ctx * kv_dim]`
    v: Vec<Vec<f16>>,
}

/// Per-sequence f16 key/value storage for every layer.
pub struct KvCache {
    n_layer: usize,
    kv_dim: usize,
    n_ctx: usize,
    seqs: Vec<Option<SeqCache>>,
}

impl KvCache {
    /// A cache for up to `n_seq` sequences of up to `n_ctx` positions each.
    pub fn new(cfg: &ModelConfig, n_ctx: usize, n_seq: usize) -> KvCache {
        KvCache {
            n_layer: cfg.n_layer,
            kv_dim: cfg.kv_dim(),
            n_ctx,
            seqs: (0..n_seq.max(1)).map(|_| None).collect(),
        }
    }

    /// Positions each sequence can hold.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn n_seq(&self) -> usize {
        self.seqs.len()
    }

    /// Bytes of storage one sequence takes.
    pub fn bytes_per_seq(&self) -> usize {
        2 * self.n_layer * self.n_ctx * self.kv_dim * std::mem::size_of::<f16>()
    }

    /// Positions cached for `seq` (0 for an unknown or unused sequence).
    pub fn seq_len(&self, seq: SeqId) -> usize {
        self.seqs
            .get(seq)
            .and_then(|s| s.as_ref())
            .map_or(0, |s| s.len)
    }

    /// Forgets positions `len..` of `seq` (keeps the prefix, e.g. a chat history that did
    /// not change). Storage is kept for reuse.
    pub fn truncate(&mut self, seq: SeqId, len: usize) {
        if let Some(Some(s)) = self.seqs.get_mut(seq) {
            s.len = s.len.min(len);
        }
    }

    /// Forgets everything cached for `seq`.
    pub fn clear(&mut self, seq: SeqId) {
        self.truncate(seq, 0);
    }

    /// Makes room for `seq` to grow to `new_len` positions.
    pub(crate) fn reserve(&mut self, seq: SeqId, new_len: usize) -> Result<()> {
        if seq >= self.seqs.len() {
            return Err(ModelError::Batch(format!(
                "sequence id {seq} is out of range (the cache holds {} sequences)",
                self.seqs.len()
            )));
        }
        if new_len > self.n_ctx {
            return Err(ModelError::ContextOverflow {
                seq,
                needed: new_len,
                n_ctx: self.n_ctx,
            });
        }
        if self.seqs[seq].is_none() {
            let size = self.n_ctx * self.kv_dim;
            self.seqs[seq] = Some(SeqCache {
                len: 0,
                k: (0..self.n_layer).map(|_| vec![f16::ZERO; size]).collect(),
                v: (0..self.n_layer).map(|_| vec![f16::ZERO; size]).collect(),
            });
        }
        Ok(())
    }

    /// Sets the length of `seq` after a forward pass wrote its new positions.
    pub(crate) fn set_len(&mut self, seq: SeqId, len: usize) {
        if let Some(Some(s)) = self.seqs.get_mut(seq) {
            s.len = len;
        }
    }

    fn seq(&self, seq: SeqId) -> &SeqCache {
        self.seqs[seq].as_ref().expect("reserved before use")
    }

    /// Writes the key and value rows (`kv_dim` floats each) of one position, rounding to f16.
    pub(crate) fn write(&mut self, layer: usize, seq: SeqId, pos: usize, k: &[f32], v: &[f32]) {
        let d = self.kv_dim;
        let s = self.seqs[seq].as_mut().expect("reserved before use");
        mica_kernels::ops::f32_to_f16(k, &mut s.k[layer][pos * d..(pos + 1) * d]);
        mica_kernels::ops::f32_to_f16(v, &mut s.v[layer][pos * d..(pos + 1) * d]);
    }

    /// Keys of positions `0..n` of `seq` in `layer`: `[n][kv_dim]`.
    pub(crate) fn keys(&self, layer: usize, seq: SeqId, n: usize) -> &[f16] {
        &self.seq(seq).k[layer][..n * self.kv_dim]
    }

    /// Values of positions `0..n` of `seq` in `layer`: `[n][kv_dim]`.
    pub(crate) fn values(&self, layer: usize, seq: SeqId, n: usize) -> &[f16] {
        &self.seq(seq).v[layer][..n * self.kv_dim]
    }
}
