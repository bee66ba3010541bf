//! Checkpoints of a hybrid model's recurrent state: the prefix cache's way back into a
//! state that cannot be cut back.
//!
//! A checkpoint is a copy of one sequence's whole recurrent state (every DeltaNet layer's
//! convolution inputs and state matrices, [`KvCache::state_bytes_per_seq`] bytes) as it was
//! after a given number of positions. The cache holds a fixed number of them
//! ([`KvCache::set_checkpoints`]); an outside manager (mica-engine's) decides which
//! checkpoint holds what and when to drop it.
//!
//! - **Capture** ([`KvCache::capture_state`]): the next forward pass copies each DeltaNet
//!   layer's part of the sequence's state into the checkpoint right after that layer has
//!   computed the named position, so the state at any position inside a batch can be saved
//!   without splitting the batch there. The pass completes the checkpoint once every layer
//!   has run ([`KvCache::checkpoint_len`] then reports it).
//! - **Restore** ([`KvCache::restore_state`]): copies a checkpoint into a sequence's state; the
//!   sequence then continues at the checkpoint's position (its keys and values up to there
//!   come from the blocks the manager installs). The recurrence is computed token by token,
//!   the same way for prompts and decoding, so continuing from a restored state gives the
//!   logits of computing every position from the start, bit for bit.

use super::{KvCache, SeqId, SeqState};
use crate::error::{ModelError, Result};

impl KvCache {
    /// Keeps room for `n` checkpoints (each allocated on its first capture). Shrinking drops
    /// the checkpoints past `n`.
    pub fn set_checkpoints(&mut self, n: usize) {
        self.checkpoints.resize_with(n, SeqState::default);
    }

    /// Checkpoints the cache has room for.
    pub fn n_checkpoints(&self) -> usize {
        self.checkpoints.len()
    }

    /// Positions checkpoint `ckpt` holds the state of (`None`: empty or out of range).
    pub fn checkpoint_len(&self, ckpt: usize) -> Option<usize> {
        self.checkpoints
            .get(ckpt)
            .filter(|c| !c.ssm.is_empty() && c.len > 0)
            .map(|c| c.len)
    }

    /// Empties checkpoint `ckpt` (its memory is kept for the next capture).
    pub fn drop_checkpoint(&mut self, ckpt: usize) {
        if let Some(c) = self.checkpoints.get_mut(ckpt) {
            c.len = 0;
        }
    }

    /// Asks for `seq`'s state after its first `at` positions to be saved in checkpoint
    /// `ckpt` by the next forward pass that computes position `at - 1` of `seq` (the
    /// checkpoint is empty until then). A pass that does not reach it leaves the request for
    /// a later one; a pass starting at or past `at` drops it, and
    /// [`KvCache::clear_captures`] drops them all.
    pub fn capture_state(&mut self, seq: SeqId, at: usize, ckpt: usize) -> Result<()> {
        let Some(l) = &self.state_layout else {
            return Err(ModelError::Batch(
                "only a hybrid model's cache keeps recurrent-state checkpoints".into(),
            ));
        };
        let (n_slots, conv_len, ssm_len) = (l.n_slots, l.conv_len, l.ssm_len);
        let n_ckpt = self.checkpoints.len();
        let n_seq = self.states.len();
        if ckpt >= n_ckpt || seq >= n_seq || at == 0 {
            return Err(ModelError::Batch(format!(
                "cannot capture position {at} of sequence {seq} into checkpoint {ckpt} (the \
                 cache holds {n_seq} sequences and {n_ckpt} checkpoints)"
            )));
        }
        let c = &mut self.checkpoints[ckpt];
        if c.ssm.is_empty() {
            c.conv = vec![0.0; n_slots * conv_len];
            c.ssm = vec![0.0; n_slots * ssm_len];
        }
        c.len = 0;
        let list = &mut self.captures[seq];
        list.retain(|&(_, k)| k != ckpt);
        let i = list.partition_point(|&(p, _)| p <= at);
        list.insert(i, (at, ckpt));
        Ok(())
    }

    /// Drops every capture asked of later passes, for all sequences.
    pub fn clear_captures(&mut self) {
        self.captures.iter_mut().for_each(Vec::clear);
    }

    /// Copies checkpoint `ckpt`, the state after `at` positions, into `seq`'s state; `seq`
    /// then continues at `at` (its block table must hold the keys and values of the
    /// positions before it). An error when the checkpoint holds no state or another
    /// position's.
    pub fn restore_state(&mut self, ckpt: usize, seq: SeqId, at: usize) -> Result<()> {
        let len = self.checkpoint_len(ckpt);
        if len != Some(at) {
            return Err(ModelError::Batch(format!(
                "checkpoint {ckpt} holds the recurrent state after {} positions, not {at}",
                len.unwrap_or(0)
            )));
        }
        let n_seq = self.states.len();
        let src = &self.checkpoints[ckpt];
        let dst = self.states.get_mut(seq).ok_or_else(|| {
            ModelError::Batch(format!(
                "sequence id {seq} is out of range (the cache holds {n_seq} sequences)"
            ))
        })?;
        dst.conv.clone_from(&src.conv);
        dst.ssm.clone_from(&src.ssm);
        dst.len = at;
        Ok(())
    }

    /// Whether a checkpoint of `seq` is asked for at `at` (a DeltaNet layer must then call
    /// [`KvCache::capture_layer`] once position `at - 1` is computed, before going on).
    pub(crate) fn wants_capture(&self, seq: SeqId, at: usize) -> bool {
        self.captures
            .get(seq)
            .is_some_and(|list| list.iter().any(|&(p, _)| p == at))
    }

    /// Called by a DeltaNet layer after it computed position `at - 1` of `seq`: saves the
    /// layer's part of the state into the checkpoints asked for at `at`.
    pub(crate) fn capture_layer(&mut self, layer: usize, seq: SeqId, at: usize) {
        let Some(list) = self.captures.get(seq) else {
            return;
        };
        if list.is_empty() {
            return;
        }
        let Some(l) = &self.state_layout else { return };
        let Some(slot) = l.slot[layer] else { return };
        let (cl, sl) = (l.conv_len, l.ssm_len);
        let st = &self.states[seq];
        for &(p, k) in list {
            if p == at {
                let c = &mut self.checkpoints[k];
                c.conv[slot * cl..(slot + 1) * cl].copy_from_slice(&st.conv[slot * cl..][..cl]);
                c.ssm[slot * sl..(slot + 1) * sl].copy_from_slice(&st.ssm[slot * sl..][..sl]);
            }
        }
    }

    /// Before a pass continues `seq` at `start`: captures it can no longer reach are dropped.
    pub(super) fn begin_captures(&mut self, seq: SeqId, start: usize) {
        if let Some(list) = self.captures.get_mut(seq) {
            list.retain(|&(p, _)| p > start);
        }
    }

    /// After a pass in which every layer ran and `seq`'s state reached `len` positions: the
    /// captures at or before `len` are complete.
    pub(super) fn end_captures(&mut self, seq: SeqId, len: usize) {
        let Some(list) = self.captures.get_mut(seq) else {
            return;
        };
        let done = list.partition_point(|&(p, _)| p <= len);
        for (p, k) in list.drain(..done) {
            self.checkpoints[k].len = p;
        }
    }
}
