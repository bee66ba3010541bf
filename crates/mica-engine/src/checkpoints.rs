//! Which recurrent-state checkpoint holds which prefix: the bookkeeping half of prefix
//! caching for hybrid models (the state itself lives in `mica_models::KvCache`, see its
//! `checkpoint` module).
//!
//! A hybrid model's cached keys and values are useless without the recurrent state at the
//! end of the prefix they hold, and that state cannot be cut back from a longer one. So the
//! block manager ([`crate::kv_manager`]) takes a cached prefix only up to a block that has a
//! checkpoint: a saved state keyed by the chained hash of that block, i.e. by the exact
//! tokens (and attention arithmetic) of the whole prefix up to its end.
//!
//! Checkpoints are a fixed pool of [`CkptId`]s. One is *reserved* when a step is planned to
//! capture a state, *committed* under a block hash once the step computed it, *pinned* while
//! an admitted sequence waits to restore it (a pinned checkpoint is never reused), and
//! otherwise kept least recently used first: when a capture needs one and none is free, the
//! least recently used is evicted. A checkpoint also goes when the block it is keyed by
//! leaves the prefix cache (nothing could match it any more).

use std::collections::{BTreeMap, HashMap};

/// Index of a checkpoint in the pool (`mica_models::KvCache`'s checkpoint index).
pub type CkptId = usize;

#[derive(Clone, Debug, Default)]
struct Meta {
    /// The block hash it is committed under.
    hash: Option<u64>,
    /// Position in the LRU queue while committed and unpinned.
    stamp: Option<u64>,
    pins: u32,
}

/// The checkpoint pool's bookkeeping.
#[derive(Debug)]
pub struct Checkpoints {
    meta: Vec<Meta>,
    /// Never used or released checkpoints.
    free: Vec<CkptId>,
    /// Committed, unpinned checkpoints by last use (lowest evicted first).
    lru: BTreeMap<u64, CkptId>,
    by_hash: HashMap<u64, CkptId>,
    clock: u64,
}

impl Checkpoints {
    pub fn new(n: usize) -> Checkpoints {
        Checkpoints {
            meta: vec![Meta::default(); n],
            free: (0..n).rev().collect(),
            lru: BTreeMap::new(),
            by_hash: HashMap::new(),
            clock: 0,
        }
    }

    /// Checkpoints in the pool.
    pub fn capacity(&self) -> usize {
        self.meta.len()
    }

    /// Committed checkpoints (pinned or not).
    pub fn n_committed(&self) -> usize {
        self.by_hash.len()
    }

    /// The checkpoint committed under block hash `h`.
    pub fn get(&self, h: u64) -> Option<CkptId> {
        self.by_hash.get(&h).copied()
    }

    /// Keeps `id` from being evicted until [`Checkpoints::unpin`].
    pub fn pin(&mut self, id: CkptId) {
        let m = &mut self.meta[id];
        if let Some(s) = m.stamp.take() {
            self.lru.remove(&s);
        }
        m.pins += 1;
    }

    /// Drops one pin; the last one makes `id` the most recently used.
    pub fn unpin(&mut self, id: CkptId) {
        let m = &mut self.meta[id];
        m.pins = m.pins.saturating_sub(1);
        if m.pins == 0 && m.hash.is_some() {
            self.clock += 1;
            m.stamp = Some(self.clock);
            self.lru.insert(self.clock, id);
        }
    }

    /// A checkpoint to capture into: a free one, else the least recently used committed
    /// one (evicted). `None` when every checkpoint is pinned or reserved.
    pub fn reserve(&mut self) -> Option<CkptId> {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let (_, id) = self.lru.pop_first()?;
                let m = &mut self.meta[id];
                m.stamp = None;
                if let Some(h) = m.hash.take() {
                    self.by_hash.remove(&h);
                }
                id
            }
        };
        Some(id)
    }

    /// Gives back a reserved checkpoint that was not committed.
    pub fn release(&mut self, id: CkptId) {
        debug_assert!(self.meta[id].hash.is_none() && self.meta[id].pins == 0);
        self.free.push(id);
    }

    /// Commits reserved checkpoint `id` under block hash `h`. When `h` already has one, `id`
    /// is released instead (the existing one becomes the most recently used) and false is
    /// returned.
    pub fn commit(&mut self, id: CkptId, h: u64) -> bool {
        if let Some(&old) = self.by_hash.get(&h) {
            self.release(id);
            self.touch(old);
            return false;
        }
        self.by_hash.insert(h, id);
        self.meta[id].hash = Some(h);
        self.clock += 1;
        self.meta[id].stamp = Some(self.clock);
        self.lru.insert(self.clock, id);
        true
    }

    /// Drops the checkpoint committed under `h`, unless it is pinned.
    pub fn forget(&mut self, h: u64) {
        let Some(&id) = self.by_hash.get(&h) else {
            return;
        };
        let m = &mut self.meta[id];
        if m.pins > 0 {
            return;
        }
        if let Some(s) = m.stamp.take() {
            self.lru.remove(&s);
        }
        m.hash = None;
        self.by_hash.remove(&h);
        self.free.push(id);
    }

    fn touch(&mut self, id: CkptId) {
        let m = &mut self.meta[id];
        if let Some(s) = m.stamp.take() {
            self.lru.remove(&s);
            self.clock += 1;
            m.stamp = Some(self.clock);
            self.lru.insert(self.clock, id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_commit_evict_lru_and_pins() {
        let mut c = Checkpoints::new(2);
        let a = c.reserve().unwrap();
        let b = c.reserve().unwrap();
        assert!(c.reserve().is_none(), "both reserved");
        assert!(c.commit(a, 10));
        assert!(c.commit(b, 20));
        assert_eq!((c.get(10), c.get(20)), (Some(a), Some(b)));
        // A duplicate commit releases the new one and refreshes the old.
        let d = c.reserve().unwrap();
        assert_eq!(d, a, "the least recently used is evicted");
        assert_eq!(c.get(10), None);
        assert!(!c.commit(d, 20));
        // 20 is now the most recent; the next reserve takes the free one, then evicts 20
        // only when nothing else is left.
        let e = c.reserve().unwrap();
        assert_eq!(e, d);
        c.pin(b);
        assert!(c.reserve().is_none(), "pinned is never evicted");
        c.forget(20);
        assert_eq!(c.get(20), Some(b), "pinned survives its block");
        c.unpin(b);
        c.forget(20);
        assert_eq!(c.get(20), None);
        assert_eq!(c.reserve(), Some(b));
        c.release(e);
        c.release(b);
        assert_eq!(c.n_committed(), 0);
        assert_eq!(c.capacity(), 2);
    }
}
