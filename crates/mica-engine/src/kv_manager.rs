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
        let mut parent = 0u64;
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
            let parent = if i == 0 { 0 } else { seq.hashes[i - 1] };
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
mod tests {
    use super::*;

    fn toks(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 7 + salt).collect()
    }

    #[test]
    fn allocation_counts_blocks_and_fails_cleanly() {
        let mut m = BlockManager::new(4, 16);
        let mut s = SeqBlocks::default();
        let mut copies = Vec::new();
        assert!(m.allocate(&mut s, 0, 17, &mut copies));
        assert_eq!(s.len(), 2);
        assert_eq!((m.n_used(), m.n_free()), (2, 2));
        assert!(m.allocate(&mut s, 17, 32, &mut copies), "fits in block 2");
        assert_eq!(s.len(), 2);
        let mut t = SeqBlocks::default();
        assert!(!m.allocate(&mut t, 0, 49, &mut copies), "needs 4, has 2");
        assert!(t.is_empty());
        assert_eq!(m.n_free(), 2);
        m.free(&mut s);
        assert_eq!((m.n_used(), m.n_free()), (0, 4));
        assert!(copies.is_empty());
    }

    #[test]
    fn prefix_blocks_are_shared_and_survive_the_request() {
        let mut m = BlockManager::new(8, 4);
        let prompt = toks(10, 1);
        let mut a = SeqBlocks::default();
        assert_eq!(m.match_prefix(&mut a, &prompt, prompt.len()), 0);
        assert!(m.allocate(&mut a, 0, 10, &mut Vec::new()));
        m.computed(&mut a, 0, 10, false);
        m.cache_full_blocks(&mut a, &prompt, 10);
        assert_eq!(m.n_cached(), 2, "two full blocks of 4");

        // Same prompt while `a` runs: shares the two full blocks.
        let mut b = SeqBlocks::default();
        assert_eq!(m.match_prefix(&mut b, &prompt, prompt.len()), 8);
        assert_eq!(&b.blocks[..], &a.blocks[..2]);
        assert_eq!(m.refs(a.blocks[0]), 2);

        // After both end the blocks stay cached (and count as free).
        let first = a.blocks[0];
        m.free(&mut a);
        m.free(&mut b);
        assert_eq!(m.n_free(), 8);
        let mut c = SeqBlocks::default();
        assert_eq!(m.match_prefix(&mut c, &prompt, prompt.len()), 8);
        assert_eq!(c.blocks[0], first);

        // A prompt that differs in the first block shares nothing (chained hash).
        let mut other = prompt.clone();
        other[0] += 1;
        let mut d = SeqBlocks::default();
        assert_eq!(m.match_prefix(&mut d, &other, other.len()), 0);
        m.record_lookup(10, 8);
        let s = m.stats();
        assert_eq!((s.hit_tokens, s.queried_tokens), (8, 10));
    }

    #[test]
    fn match_leaves_the_last_token_to_compute() {
        let mut m = BlockManager::new(8, 4);
        let prompt = toks(8, 3);
        let mut a = SeqBlocks::default();
        assert!(m.allocate(&mut a, 0, 8, &mut Vec::new()));
        m.computed(&mut a, 0, 8, false);
        m.cache_full_blocks(&mut a, &prompt, 8);
        m.free(&mut a);
        let mut b = SeqBlocks::default();
        assert_eq!(
            m.match_prefix(&mut b, &prompt, prompt.len()),
            4,
            "block 2 holds the last token"
        );
    }

    #[test]
    fn eviction_is_lru_and_tail_first() {
        let mut m = BlockManager::new(4, 2);
        let (p, q) = (toks(4, 0), toks(4, 100));
        for prompt in [&p, &q] {
            let mut s = SeqBlocks::default();
            assert!(m.allocate(&mut s, 0, 4, &mut Vec::new()));
            m.computed(&mut s, 0, 4, false);
            m.cache_full_blocks(&mut s, prompt, 4);
            m.free(&mut s);
        }
        assert_eq!((m.n_cached(), m.n_free()), (4, 4));
        // One new block evicts p's tail (released first, tail first).
        let mut s = SeqBlocks::default();
        assert!(m.allocate(&mut s, 0, 2, &mut Vec::new()));
        let mut probe = SeqBlocks::default();
        assert_eq!(
            m.match_prefix(&mut probe, &toks(5, 0), 5),
            2,
            "p keeps block 0"
        );
        m.free(&mut probe);
        let mut probe = SeqBlocks::default();
        assert_eq!(m.match_prefix(&mut probe, &toks(5, 100), 5), 4, "q intact");
    }

    #[test]
    fn fork_shares_and_copies_on_write() {
        let mut m = BlockManager::new(6, 4);
        let prompt = toks(6, 9);
        let mut a = SeqBlocks::default();
        let mut copies = Vec::new();
        assert!(m.allocate(&mut a, 0, 6, &mut copies));
        let mut b = m.fork(&a);
        assert_eq!(m.refs(a.blocks[1]), 2);
        // `b` writes position 6, inside the shared partial block 1: it gets a copy.
        assert!(m.allocate(&mut b, 6, 7, &mut copies));
        assert_eq!(copies, vec![(a.blocks[1], b.blocks[1])]);
        assert_ne!(a.blocks[1], b.blocks[1]);
        assert_eq!(a.blocks[0], b.blocks[0], "the full block stays shared");
        assert_eq!((m.refs(a.blocks[1]), m.refs(b.blocks[1])), (1, 1));
        // `a` now owns block 1 alone: no copy.
        copies.clear();
        assert!(m.allocate(&mut a, 6, 7, &mut copies));
        assert!(copies.is_empty());
        m.computed(&mut a, 0, 4, false);
        m.cache_full_blocks(&mut a, &prompt, 4);
        m.free(&mut a);
        m.free(&mut b);
        assert_eq!(m.n_used(), 0);
    }

    #[test]
    fn duplicate_blocks_stay_private() {
        let mut m = BlockManager::new(4, 2);
        let p = toks(3, 5);
        let (mut a, mut b) = (SeqBlocks::default(), SeqBlocks::default());
        assert!(m.allocate(&mut a, 0, 3, &mut Vec::new()));
        assert!(m.allocate(&mut b, 0, 3, &mut Vec::new()));
        m.computed(&mut a, 0, 3, false);
        m.cache_full_blocks(&mut a, &p, 3);
        m.computed(&mut b, 0, 3, false);
        m.cache_full_blocks(&mut b, &p, 3);
        assert_eq!(m.n_cached(), 1);
        m.free(&mut b);
        m.free(&mut a);
        assert_eq!(m.n_free(), 4);
        assert_eq!(m.n_cached(), 1);
    }

    #[test]
    fn truncate_releases_the_tail_and_unregisters_a_partial_block() {
        let mut m = BlockManager::new(6, 4);
        let p = toks(12, 2);
        let mut a = SeqBlocks::default();
        assert!(m.allocate(&mut a, 0, 12, &mut Vec::new()));
        m.computed(&mut a, 0, 12, false);
        m.cache_full_blocks(&mut a, &p, 12);
        assert_eq!((m.n_used(), m.n_cached()), (3, 3));
        // Back to 10 positions: block 2 (8..12) is kept but no longer full, so it leaves
        // the cache; nothing is released.
        m.truncate(&mut a, 10);
        assert_eq!((a.len(), m.n_used(), m.n_cached()), (3, 3, 2));
        // Back to 4: blocks 1 and 2 released; block 1 was full and stays cached (its
        // content is still that of its tokens).
        m.truncate(&mut a, 4);
        assert_eq!((a.len(), m.n_used(), m.n_cached()), (1, 1, 2));
        let mut b = SeqBlocks::default();
        assert_eq!(
            m.match_prefix(&mut b, &p, p.len()),
            8,
            "blocks 0 and 1 still match"
        );
        m.free(&mut b);
        // Re-registering after regrowth works through the kept hash chain.
        assert!(m.allocate(&mut a, 4, 12, &mut Vec::new()));
        m.computed(&mut a, 0, 12, false);
        m.cache_full_blocks(&mut a, &p, 12);
        m.free(&mut a);
        assert_eq!(m.n_used(), 0);
        // A shared partial block stays cached: the next write copies it.
        let mut c = SeqBlocks::default();
        assert_eq!(m.match_prefix(&mut c, &p, p.len()), 8);
        let mut d = m.fork(&c);
        m.truncate(&mut d, 6);
        assert_eq!(m.n_cached(), 3);
        let mut copies = Vec::new();
        assert!(m.allocate(&mut d, 6, 7, &mut copies));
        assert_eq!(copies, vec![(c.blocks[1], d.blocks[1])]);
        m.free(&mut c);
        m.free(&mut d);
        assert_eq!(m.n_used(), 0);
    }

    #[test]
    fn blocks_are_shared_only_with_the_arithmetic_a_prompt_gets_alone() {
        let bs = 16;
        let mut m = BlockManager::new(64, bs);
        // A long prompt (tiled path) caches its blocks as tiled ones.
        let long = toks(TILED_MIN_TOKENS + 40, 1);
        let mut a = SeqBlocks::default();
        assert!(m.allocate(&mut a, 0, long.len(), &mut Vec::new()));
        m.computed(&mut a, 0, long.len(), true);
        m.cache_full_blocks(&mut a, &long, long.len());
        m.free(&mut a);
        // A short prompt with the same first blocks computes them on the vector path:
        // nothing matches.
        let short = long[..TILED_MIN_TOKENS - 8].to_vec();
        let mut b = SeqBlocks::default();
        assert_eq!(m.match_prefix(&mut b, &short, short.len()), 0);
        // The long prompt matches; so does its first part as the prompt of a sequence that
        // went on generating (a preempted one coming back).
        assert_eq!(
            m.match_prefix(&mut b, &long, long.len()),
            (long.len() - 1) / bs * bs
        );
        m.free(&mut b);
        assert_eq!(
            m.match_prefix(&mut b, &long, TILED_MIN_TOKENS),
            (long.len() - 1) / bs * bs
        );
        m.free(&mut b);

        // The short prompt's own (vector) blocks are cached beside the tiled ones and
        // match it.
        let mut c = SeqBlocks::default();
        assert!(m.allocate(&mut c, 0, short.len(), &mut Vec::new()));
        m.computed(&mut c, 0, short.len(), false);
        m.cache_full_blocks(&mut c, &short, short.len());
        m.free(&mut c);
        let mut d = SeqBlocks::default();
        assert_eq!(
            m.match_prefix(&mut d, &short, short.len()),
            (short.len() - 1) / bs * bs
        );
        m.free(&mut d);

        // A block holding a prompt's tiled end and decoded (vector) tokens is never cached,
        // nor is anything after it.
        let mut e = SeqBlocks::default();
        let p = toks(TILED_MIN_TOKENS + 8, 50);
        let n = p.len() + 2 * bs;
        assert!(m.allocate(&mut e, 0, n, &mut Vec::new()));
        m.computed(&mut e, 0, p.len(), true);
        for pos in p.len()..n {
            m.computed(&mut e, pos, 1, false);
        }
        let cached = m.n_cached();
        let all = toks(n, 50);
        m.cache_full_blocks(&mut e, &all, n);
        assert_eq!(
            m.n_cached(),
            cached + p.len() / bs + 1,
            "the mixed block is private"
        );
        m.free(&mut e);
        assert_eq!(m.n_used(), 0);
    }

    /// Computes `prompt` (vector path) in `seq` from position 0, with capture planning and
    /// committing as the engine does, generating nothing.
    fn compute(m: &mut BlockManager, seq: &mut SeqBlocks, prompt: &[u32]) {
        let hit = m.match_prefix(seq, prompt, prompt.len());
        let n = prompt.len() - hit;
        assert!(m.allocate(seq, hit, prompt.len(), &mut Vec::new()));
        m.take_restore(seq);
        m.plan_captures(seq, hit, n, prompt.len());
        m.computed(seq, hit, n, false);
        m.cache_full_blocks(seq, prompt, prompt.len());
        m.commit_captures(seq, prompt.len());
    }

    #[test]
    fn a_hybrid_prefix_ends_at_a_checkpoint_which_goes_with_its_block() {
        let mut m = BlockManager::new(8, 4);
        m.set_checkpoints(4, 0);
        // 11 tokens: blocks 0..8 full, a checkpoint at the last boundary before the last
        // token (8).
        let p = toks(11, 1);
        let mut a = SeqBlocks::default();
        compute(&mut m, &mut a, &p);
        assert_eq!(m.n_cached(), 2);
        assert_eq!(m.checkpoints().unwrap().n_committed(), 1);
        m.free(&mut a);
        // The same prompt takes both blocks and the checkpoint; one that shares only block
        // 0 finds it cached but has no state there: nothing is taken, and it checkpoints
        // where it leaves the first prompt (4) besides its own end.
        let mut b = SeqBlocks::default();
        assert_eq!(m.match_prefix(&mut b, &p, p.len()), 8);
        let ck = m.take_restore(&mut b).expect("a checkpoint to restore");
        assert_eq!(m.checkpoints().unwrap().get(b.hashes[1]), Some(ck));
        m.free(&mut b);
        let mut q = p[..4].to_vec();
        q.extend(toks(7, 50));
        let mut c = SeqBlocks::default();
        assert_eq!(m.match_prefix(&mut c, &q, q.len()), 0);
        assert!(m.take_restore(&mut c).is_none());
        m.free(&mut c);
        let mut c = SeqBlocks::default();
        compute(&mut m, &mut c, &q);
        assert_eq!(
            m.checkpoints().unwrap().n_committed(),
            3,
            "at 8 (p), 4 and 8 (q)"
        );
        m.free(&mut c);
        let mut r = p[..4].to_vec();
        r.extend(toks(5, 90));
        let mut d = SeqBlocks::default();
        assert_eq!(m.match_prefix(&mut d, &r, r.len()), 4, "the shared start");
        assert!(m.take_restore(&mut d).is_some());
        m.free(&mut d);
        // Evicting the blocks drops the checkpoints keyed by them.
        let mut e = SeqBlocks::default();
        assert!(m.allocate(&mut e, 0, 32, &mut Vec::new()));
        assert_eq!(m.n_cached(), 0);
        assert_eq!(m.checkpoints().unwrap().n_committed(), 0);
        m.free(&mut e);
        // A fork neither restores nor captures for its parent.
        let mut f = SeqBlocks::default();
        assert!(m.allocate(&mut f, 0, 11, &mut Vec::new()));
        m.plan_captures(&mut f, 0, 11, 11);
        assert_eq!(f.captures().count(), 1);
        let mut g = m.fork(&f);
        assert_eq!(g.captures().count(), 0);
        m.free(&mut g);
        m.free(&mut f);
        assert_eq!(m.n_used(), 0);
    }
}
