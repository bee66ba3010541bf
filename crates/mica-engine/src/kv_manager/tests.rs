//! Unit tests of the block manager: allocation, prefix sharing, eviction, forks, truncation,
//! the arithmetic rule of shared blocks and hybrid checkpoints.

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

/// A salted sequence (LoRA adapters) shares cached blocks only with sequences of its salt,
/// the salt surviving a free (preemption) and a fork.
#[test]
fn salted_prefixes_are_shared_only_under_the_same_salt() {
    let mut m = BlockManager::new(16, 4);
    let prompt = toks(10, 3);
    let compute = |m: &mut BlockManager, s: &mut SeqBlocks| {
        let hit = m.match_prefix(s, &prompt, prompt.len());
        assert!(m.allocate(s, hit, 10, &mut Vec::new()));
        m.computed(s, hit, 10 - hit, false);
        m.cache_full_blocks(s, &prompt, 10);
        hit
    };
    let mut a = SeqBlocks::default();
    a.set_salt(42);
    assert_eq!(compute(&mut m, &mut a), 0);
    let mut plain = SeqBlocks::default();
    assert_eq!(
        compute(&mut m, &mut plain),
        0,
        "unsalted: not the salted blocks"
    );
    let mut other = SeqBlocks::default();
    other.set_salt(43);
    assert_eq!(m.match_prefix(&mut other, &prompt, prompt.len()), 0);
    let mut b = SeqBlocks::default();
    b.set_salt(42);
    assert_eq!(m.match_prefix(&mut b, &prompt, prompt.len()), 8);
    assert_eq!(&b.blocks[..], &a.blocks[..2]);
    let mut c = m.fork(&b);
    m.free(&mut b);
    assert_eq!(
        m.match_prefix(&mut b, &prompt, prompt.len()),
        8,
        "salt kept"
    );
    m.free(&mut c);
    let mut d = SeqBlocks::default();
    assert_eq!(m.match_prefix(&mut d, &prompt, prompt.len()), 8);
    assert_eq!(&d.blocks[..], &plain.blocks[..2], "the unsalted ones");
}
