//! The KV block manager: which cache blocks each sequence uses, shared blocks, and the
//! automatic prefix cache. Pure bookkeeping (no model, no tensors), so the scheduler and its
//! tests run without one; the engine applies its decisions to `mica_models::KvCache`.
//!
//! Follows vLLM v1's `KVCacheManager` / `BlockPool`:
//! - A pool of `n_blocks` blocks of `block_size` positions; each block has a reference count
//!   (the sequences whose block table holds it).
//! - **Prefix caching**: once a block is full, it is keyed by a hash of its tokens chained
//!   with the hash of the block before it (so a key names the whole prefix up to the block's
//!   end). A new sequence whose first blocks hash to cached keys takes those blocks instead
//!   of computing them (the tokens are compared too, so a hash collision can't alias).
//! - **Same arithmetic**: the key also names how the block's positions were computed —
//!   attention's vector path (decoding, prompts under [`TILED_MIN_TOKENS`] tokens) or its
//!   tiled path (longer prompts), which round differently (see `mica_models`
//!   `AttentionPolicy`) — and the path of every block before it, through the chain. A
//!   prompt takes only blocks computed the way it would compute them alone (tiled for a
//!   prompt of [`TILED_MIN_TOKENS`] tokens or more, vector below), so a cached prefix never
//!   changes what a request generates. Blocks of mixed arithmetic (a prompt's end and the first generated
//!   tokens) are never shared.
//! - Blocks whose count drops to zero stay cached and become *evictable*, least recently
//!   released first; within one sequence its tail blocks go first, so a common prefix lives
//!   longest. Blocks that were never full (no key) are reused before any cached block.
//! - **Copy-on-write**: [`BlockManager::fork`] shares every block of a sequence with a new
//!   one (e.g. OpenAI's `n` completions of one prompt). When a sequence is about to write
//!   into a block another sequence still holds, it gets a private copy first: the manager
//!   returns the `(src, dst)` copy for the engine to perform.
//! - **Hybrid models** ([`BlockManager::set_checkpoints`]): cached keys and values are of
//!   use only with the recurrent state at the end of the prefix they hold, so a prompt takes
//!   cached blocks only up to the last one that has a state checkpoint
//!   ([`crate::checkpoints`]), and the engine restores that checkpoint into the sequence's
//!   state ([`BlockManager::take_restore`]). Which states get saved is planned per step
//!   ([`BlockManager::plan_captures`]): at the last block boundary of the prompt (a repeated
//!   or extended prompt takes everything before its last block), at the end of the blocks a
//!   prompt found cached beyond its checkpoint (the point where prompts sharing a system
//!   prompt part ways, so the next one takes all of it), every `interval` positions of a
//!   prompt when asked, and at the last block boundary a sequence has generated to (the end
//!   of a chat turn, which the next turn's prompt extends; each such checkpoint replaces the
//!   sequence's previous one). They are committed under the block's hash once computed
//!   ([`BlockManager::commit_captures`]) and dropped with that block.

use crate::checkpoints::{Checkpoints, CkptId};
use mica_models::blocks::attention::TILED_MIN_TOKENS;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// Index of a block in the pool.
pub type BlockId = u32;

/// The blocks of one sequence, in position order.
#[derive(Clone, Debug, Default)]
pub struct SeqBlocks {
    /// Block of positions `i * block_size ..`.
    pub blocks: Vec<BlockId>,
    /// Chained hash of each leading full block already registered in the prefix cache.
    hashes: Vec<u64>,
    /// How the computed positions of each block were computed (one entry per block with
    /// at least one computed position).
    arith: Vec<Arith>,
    /// Hybrid models: the checkpoint (pinned) whose state the sequence must start from.
    restore: Option<CkptId>,
    /// Hybrid models: blocks of the prompt found in the prefix cache, with or without a
    /// checkpoint.
    matched: usize,
    /// Hybrid models: checkpoints reserved for states still to compute, `(position,
    /// checkpoint, generated)`; `generated`: at a boundary past the prompt.
    captures: Vec<(usize, CkptId, bool)>,
    /// Hybrid models: the hash of the last checkpoint committed past the prompt.
    turn_end: Option<u64>,
    /// Mixed into the first block's key (the parent of the hash chain): what else than the
    /// tokens decides the keys and values, e.g. the sequence's LoRA adapters
    /// (`LoraSelection::cache_key`). 0 for none.
    salt: u64,
}

/// How a block's positions were computed: attention's vector or tiled path (they round
/// differently), or both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arith {
    Vector,
    Tiled,
    Mixed,
}

impl SeqBlocks {
    /// Keys this sequence's prefix-cache entries by `salt` as well as by its tokens (set
    /// while it holds no block): only sequences of the same salt share cached blocks.
    pub fn set_salt(&mut self, salt: u64) {
        debug_assert!(self.blocks.is_empty());
        self.salt = salt;
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Hybrid models: the checkpoints reserved for states the sequence is still to
    /// compute, as `(position, checkpoint)`.
    pub fn captures(&self) -> impl Iterator<Item = (usize, CkptId)> + '_ {
        self.captures.iter().map(|&(p, c, _)| (p, c))
    }
}

#[derive(Clone, Debug, Default)]
struct BlockMeta {
    refs: u32,
    /// Prefix-cache key while the block is registered.
    hash: Option<u64>,
    /// The hash of the block before it and its tokens (to verify a hash match).
    parent: u64,
    tokens: Vec<u32>,
    /// Position in the evictable queue while `refs == 0` and `hash` is set.
    stamp: Option<u64>,
}

/// Counters of the prefix cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Prompt tokens looked up.
    pub queried_tokens: u64,
    /// Of those, tokens found cached.
    pub hit_tokens: u64,
}

/// The block pool with reference counts and the prefix cache.
pub struct BlockManager {
    block_size: usize,
    meta: Vec<BlockMeta>,
    /// Free blocks without a cache key (reused first).
    free_plain: Vec<BlockId>,
    /// Free blocks with a cache key, by release stamp (lowest evicted first).
    evictable: BTreeMap<u64, BlockId>,
    /// Cache key → block.
    cached: HashMap<u64, BlockId>,
    clock: u64,
    stats: CacheStats,
    prefix_caching: bool,
    /// Hybrid models: the recurrent-state checkpoints (prefixes are taken only up to one).
    ckpt: Option<Checkpoints>,
    /// Hybrid models: capture a prompt's state every this many positions (0: never).
    ckpt_interval: usize,
}

/// Hash of a full block: its tokens and arithmetic chained after the hash of everything
/// before it.
fn block_hash(parent: u64, tokens: &[u32], arith: Arith) -> u64 {
    // SipHash with fixed keys: stable within a process, which is all the cache needs.
    let mut h = std::hash::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    arith.hash(&mut h);
    h.finish()
}

impl BlockManager {
    pub fn new(n_blocks: usize, block_size: usize) -> BlockManager {
        assert!(block_size > 0, "block size must be positive");
        BlockManager {
            block_size,
            meta: vec![BlockMeta::default(); n_blocks],
            free_plain: (0..n_blocks as BlockId).rev().collect(),
            evictable: BTreeMap::new(),
            cached: HashMap::new(),
            clock: 0,
            stats: CacheStats::default(),
            prefix_caching: true,
            ckpt: None,
            ckpt_interval: 0,
        }
    }

    /// Makes the cache a hybrid model's: prefixes are taken only up to a block whose end
    /// has one of `n` recurrent-state checkpoints, captured as the module docs say (also
    /// every `interval` positions of a prompt, a multiple of the block size; 0: not).
    pub fn set_checkpoints(&mut self, n: usize, interval: usize) {
        self.ckpt = Some(Checkpoints::new(n));
        self.ckpt_interval = interval;
    }

    /// The checkpoint bookkeeping of a hybrid model's cache.
    pub fn checkpoints(&self) -> Option<&Checkpoints> {
        self.ckpt.as_ref()
    }

    /// Turns automatic prefix caching off (every block is private, nothing is kept).
    pub fn set_prefix_caching(&mut self, on: bool) {
        self.prefix_caching = on;
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn n_blocks(&self) -> usize {
        self.meta.len()
    }

    /// Blocks that can be handed out now (never used, or cached but unreferenced).
    pub fn n_free(&self) -> usize {
        self.free_plain.len() + self.evictable.len()
    }

    /// Blocks held by at least one sequence.
    pub fn n_used(&self) -> usize {
        self.n_blocks() - self.n_free()
    }

    /// Blocks in the prefix cache (held or not).
    pub fn n_cached(&self) -> usize {
        self.cached.len()
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Reference count of a block (for tests and checks).
    pub fn refs(&self, b: BlockId) -> u32 {
        self.meta[b as usize].refs
    }

    /// Blocks needed to hold `n_tokens` positions.
    pub fn blocks_for(&self, n_tokens: usize) -> usize {
        n_tokens.div_ceil(self.block_size)
    }

    /// Takes the longest cached prefix of `tokens` (a prompt of `prompt_len` tokens and
    /// what was generated after it) for an empty `seq`: full blocks only, computed with the
    /// arithmetic the prompt gets alone (tiled for [`TILED_MIN_TOKENS`] tokens or more,
    /// vector below; the engine computes the rest of the prompt the same way), and never all
    /// of `tokens` (the last token must be computed to give logits). Returns the number of
    /// tokens now covered.
    pub fn match_prefix(
        &mut self,
        seq: &mut SeqBlocks,
        tokens: &[u32],
        prompt_len: usize,
    ) -> usize {
        debug_assert!(seq.is_empty());
        if !self.prefix_caching || tokens.is_empty() {
            return 0;
        }
        let max_blocks = (tokens.len() - 1) / self.block_size;
        let arith = if prompt_len >= TILED_MIN_TOKENS {
            Arith::Tiled
        } else {
            Arith::Vector
        };
        let mut parent = seq.salt;
        let mut found = Vec::new();
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let h = block_hash(parent, chunk, arith);
            let Some(&b) = self.cached.get(&h) else { break };
            let m = &self.meta[b as usize];
            if m.parent != parent || m.tokens != chunk {
                break;
            }
            found.push((b, h));
            parent = h;
        }
        seq.matched = found.len();
        // A hybrid model's prefix ends at the last block with a state checkpoint.
        let take = match &mut self.ckpt {
            None => found.len(),
            Some(ck) => {
                let last = found.iter().rposition(|&(_, h)| ck.get(h).is_some());
                if let Some(i) = last {
                    let id = ck.get(found[i].1).expect("just found");
                    ck.pin(id);
                    seq.restore = Some(id);
                }
                last.map_or(0, |i| i + 1)
            }
        };
        for &(b, h) in &found[..take] {
            self.acquire(b);
            seq.blocks.push(b);
            seq.hashes.push(h);
            seq.arith.push(arith);
        }
        seq.blocks.len() * self.block_size
    }

    /// Hybrid models: the checkpoint `seq` must restore its state from before its first
    /// step (taken once; it may be reused after this).
    pub fn take_restore(&mut self, seq: &mut SeqBlocks) -> Option<CkptId> {
        let id = seq.restore.take()?;
        if let Some(ck) = &mut self.ckpt {
            ck.unpin(id);
        }
        Some(id)
    }

    /// Hybrid models: reserves checkpoints for the states `seq` (a prompt of `prompt_len`
    /// tokens) reaches at the block boundaries worth keeping (module docs) within the
    /// positions `start + 1 ..= start + n` a step computes. The engine asks the cache to
    /// capture them ([`SeqBlocks::captures`]); a boundary left without one when the pool
    /// has none to spare is simply not saved.
    pub fn plan_captures(
        &mut self,
        seq: &mut SeqBlocks,
        start: usize,
        n: usize,
        prompt_len: usize,
    ) {
        let Some(ck) = &mut self.ckpt else { return };
        let bs = self.block_size;
        let prompt_end = prompt_len.saturating_sub(1) / bs * bs;
        let end = start + n;
        let mut c = (start / bs + 1) * bs;
        while c <= end {
            let generated = c >= prompt_len;
            let want = if generated {
                // Only the last boundary of the step: each replaces the one before.
                c + bs > end
            } else {
                c == prompt_end
                    || c == seq.matched * bs
                    || (self.ckpt_interval > 0 && c.is_multiple_of(self.ckpt_interval))
            };
            if want && !seq.captures.iter().any(|&(p, _, _)| p == c) {
                // A new end of the turn replaces the sequence's last one (before it takes
                // a checkpoint another prefix holds).
                if generated && let Some(prev) = seq.turn_end.take() {
                    ck.forget(prev);
                }
                let Some(id) = ck.reserve() else { return };
                seq.captures.push((c, id, generated));
            }
            c += bs;
        }
    }

    /// Hybrid models: commits the captures of `seq` that its first `n_computed` positions
    /// completed, under the hash of the block each ends (registered by
    /// [`BlockManager::cache_full_blocks`] first); a capture whose block did not enter the
    /// prefix cache, or whose prefix has a checkpoint already, is given back.
    pub fn commit_captures(&mut self, seq: &mut SeqBlocks, n_computed: usize) {
        let Some(ck) = &mut self.ckpt else { return };
        let bs = self.block_size;
        let mut i = 0;
        while i < seq.captures.len() {
            let (at, id, generated) = seq.captures[i];
            if at > n_computed {
                i += 1;
                continue;
            }
            seq.captures.swap_remove(i);
            let h = seq.hashes.get(at / bs - 1).copied();
            let Some(h) = h.filter(|h| self.cached.contains_key(h)) else {
                ck.release(id);
                continue;
            };
            if ck.commit(id, h)
                && generated
                && let Some(prev) = seq.turn_end.replace(h)
            {
                ck.forget(prev);
            }
        }
    }

    /// Gives back the checkpoints `seq` reserved or pinned.
    fn drop_checkpoints(&mut self, seq: &mut SeqBlocks) {
        if let Some(ck) = &mut self.ckpt {
            for (_, id, _) in seq.captures.drain(..) {
                ck.release(id);
            }
            if let Some(id) = seq.restore.take() {
                ck.unpin(id);
            }
        }
        seq.captures.clear();
        seq.restore = None;
        seq.matched = 0;
        seq.turn_end = None;
    }

    /// Counts one prompt's lookup in the hit-rate statistics (called once per request, not
    /// per admission attempt).
    pub fn record_lookup(&mut self, queried: usize, hit: usize) {
        self.stats.queried_tokens += queried as u64;
        self.stats.hit_tokens += hit as u64;
    }

    /// Gives `seq` room for `n_tokens` positions, of which `n_computed` are written already.
    /// Copy-on-write: if the block that the next write lands in is shared, `seq` gets a
    /// private copy and `(src, dst)` is pushed to `copies`. Returns false, changing nothing,
    /// when the pool has too few free blocks.
    pub fn allocate(
        &mut self,
        seq: &mut SeqBlocks,
        n_computed: usize,
        n_tokens: usize,
        copies: &mut Vec<(BlockId, BlockId)>,
    ) -> bool {
        let need = self.blocks_for(n_tokens).saturating_sub(seq.blocks.len());
        let write_block = n_computed / self.block_size;
        let cow = n_tokens > n_computed
            && !n_computed.is_multiple_of(self.block_size)
            && seq
                .blocks
                .get(write_block)
                .is_some_and(|&b| self.meta[b as usize].refs > 1);
        if self.n_free() < need + usize::from(cow) {
            return false;
        }
        if cow {
            let src = seq.blocks[write_block];
            let dst = self.take_free();
            self.meta[src as usize].refs -= 1;
            seq.blocks[write_block] = dst;
            seq.hashes.truncate(write_block);
            copies.push((src, dst));
        }
        for _ in 0..need {
            let b = self.take_free();
            seq.blocks.push(b);
        }
        true
    }

    /// Records that positions `start..start + n` of `seq` were computed, on attention's
    /// tiled path or not (see [`Arith`]). Positions are computed in order.
    pub fn computed(&mut self, seq: &mut SeqBlocks, start: usize, n: usize, tiled: bool) {
        if n == 0 {
            return;
        }
        let arith = if tiled { Arith::Tiled } else { Arith::Vector };
        let (first, last) = (start / self.block_size, (start + n - 1) / self.block_size);
        // A block whose earlier positions were dropped (rolled-back drafts) keeps its tag.
        seq.arith
            .truncate(first + usize::from(!start.is_multiple_of(self.block_size)));
        if let Some(a) = seq.arith.get_mut(first)
            && *a != arith
        {
            *a = Arith::Mixed;
        }
        while seq.arith.len() <= last {
            // Untracked earlier blocks (never the case in the engine) count as mixed.
            let a = if seq.arith.len() >= first {
                arith
            } else {
                Arith::Mixed
            };
            seq.arith.push(a);
        }
    }

    /// Registers the full blocks of `seq` within its first `n_computed` tokens (`tokens`
    /// holds at least that many) in the prefix cache, keyed by their arithmetic (as
    /// recorded by [`BlockManager::computed`]; blocks of mixed arithmetic stay private).
    pub fn cache_full_blocks(&mut self, seq: &mut SeqBlocks, tokens: &[u32], n_computed: usize) {
        if !self.prefix_caching {
            return;
        }
        let full = (n_computed / self.block_size).min(seq.blocks.len());
        while seq.hashes.len() < full {
            let i = seq.hashes.len();
            let parent = if i == 0 { seq.salt } else { seq.hashes[i - 1] };
            let chunk = &tokens[i * self.block_size..(i + 1) * self.block_size];
            let arith = seq.arith.get(i).copied().unwrap_or(Arith::Mixed);
            let h = block_hash(parent, chunk, arith);
            let b = seq.blocks[i];
            let m = &mut self.meta[b as usize];
            if arith != Arith::Mixed && m.hash.is_none() && !self.cached.contains_key(&h) {
                m.hash = Some(h);
                m.parent = parent;
                m.tokens.clear();
                m.tokens.extend_from_slice(chunk);
                self.cached.insert(h, b);
            }
            // A duplicate of a block cached by another sequence stays private (the hash chain
            // is still recorded so later blocks of this sequence can be registered).
            seq.hashes.push(h);
        }
    }

    /// Shrinks `seq` to positions `0..len` (drafted tokens the model rejected): blocks past
    /// them are released, and a block that is no longer full leaves the prefix cache when
    /// `seq` alone holds it (its tail will be rewritten; a block shared with another
    /// sequence is copied before the write instead, see [`BlockManager::allocate`]).
    pub fn truncate(&mut self, seq: &mut SeqBlocks, len: usize) {
        let keep = self.blocks_for(len);
        if seq.blocks.len() > keep {
            // Tail first, as in `free`.
            for &b in seq.blocks[keep..].iter().rev() {
                self.release(b);
            }
            seq.blocks.truncate(keep);
        }
        seq.arith.truncate(keep);
        let full = len / self.block_size;
        if seq.hashes.len() > full {
            seq.hashes.truncate(full);
            if let Some(&b) = seq.blocks.get(full)
                && self.meta[b as usize].refs == 1
            {
                self.forget(b);
            }
        }
    }

    /// Shares every block of `seq` with a new sequence (copy-on-write on the next write).
    pub fn fork(&mut self, seq: &SeqBlocks) -> SeqBlocks {
        for &b in &seq.blocks {
            self.acquire(b);
        }
        SeqBlocks {
            restore: None,
            captures: Vec::new(),
            turn_end: None,
            ..seq.clone()
        }
    }

    /// Releases the blocks of `seq`; cached ones stay cached until evicted.
    pub fn free(&mut self, seq: &mut SeqBlocks) {
        // Tail first: the tail of a sequence is evicted before its prefix.
        for &b in seq.blocks.iter().rev() {
            self.release(b);
        }
        seq.blocks.clear();
        seq.hashes.clear();
        seq.arith.clear();
        self.drop_checkpoints(seq);
    }

    /// Drops one reference to `b`; at zero it becomes free (evictable if cached).
    fn release(&mut self, b: BlockId) {
        let m = &mut self.meta[b as usize];
        m.refs -= 1;
        if m.refs == 0 {
            if m.hash.is_some() {
                self.clock += 1;
                m.stamp = Some(self.clock);
                self.evictable.insert(self.clock, b);
            } else {
                self.free_plain.push(b);
            }
        }
    }

    /// Drops every unreferenced cached block (e.g. when the model is unloaded).
    pub fn clear_cache(&mut self) {
        while let Some((_, b)) = self.evictable.pop_first() {
            self.forget(b);
            self.free_plain.push(b);
        }
    }

    fn acquire(&mut self, b: BlockId) {
        let m = &mut self.meta[b as usize];
        if m.refs == 0
            && let Some(stamp) = m.stamp.take()
        {
            self.evictable.remove(&stamp);
        }
        m.refs += 1;
    }

    /// A free block with one reference: a never-cached one if any, else the least recently
    /// released cached block, evicted from the cache. The caller checked `n_free() > 0`.
    fn take_free(&mut self) -> BlockId {
        let b = match self.free_plain.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.evictable.pop_first().expect("caller checked n_free");
                self.forget(b);
                b
            }
        };
        let m = &mut self.meta[b as usize];
        m.refs = 1;
        m.stamp = None;
        b
    }

    fn forget(&mut self, b: BlockId) {
        let m = &mut self.meta[b as usize];
        m.stamp = None;
        if let Some(h) = m.hash.take()
            && self.cached.get(&h) == Some(&b)
        {
            self.cached.remove(&h);
            if let Some(ck) = &mut self.ckpt {
                ck.forget(h);
            }
        }
    }
}

#[cfg(test)]
mod tests;
