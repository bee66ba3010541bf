//! The step scheduler without a model: token budget, chunked prompts, priority lanes and
//! aging, preemption order, prefix-cache admission, FIFO for comparison, drafted tokens
//! (multi-token steps) accepted in part and rolled back.

use mica_engine::scheduler::{Scheduled, prefill_chunk};
use mica_engine::{BlockManager, Lane, SchedulePolicy, Scheduler, SchedulerConfig};
use std::time::{Duration, Instant};

fn sched(policy: SchedulePolicy, budget: usize, blocks: usize) -> Scheduler {
    let cfg = SchedulerConfig {
        policy,
        max_batch_tokens: budget,
        max_running: 8,
        aging: Duration::from_secs(10),
        min_chunk: 64,
        // No cap on low lanes' chunks here (see `low_lanes_take_short_chunks`).
        low_lane_chunk: usize::MAX,
        low_lane_chunk_busy: usize::MAX,
    };
    Scheduler::new(cfg, BlockManager::new(blocks, 16))
}

fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| i.wrapping_mul(31) ^ salt).collect()
}

/// Runs a plan as the engine would: tokens computed, a token appended where one is sampled.
fn complete(s: &mut Scheduler, plan: &[Scheduled]) {
    for p in plan {
        s.on_computed(p.id, p.n, p.tiled);
        if p.sample {
            s.append_token(p.id, 7);
        }
    }
}

fn ids(plan: &[Scheduled]) -> Vec<(u64, usize)> {
    plan.iter().map(|p| (p.id, p.n)).collect()
}

#[test]
fn chunk_rule_keeps_pieces_tiled_sized() {
    assert_eq!(prefill_chunk(50, 256, 64), 50, "fits whole");
    assert_eq!(
        prefill_chunk(50, 40, 64),
        0,
        "short prompts are never split"
    );
    assert_eq!(prefill_chunk(1000, 256, 64), 256);
    assert_eq!(prefill_chunk(300, 256, 64), 236, "leaves 64, not 44");
    assert_eq!(
        prefill_chunk(100, 80, 64),
        0,
        "100 can't split into two pieces of 64"
    );
    assert_eq!(
        prefill_chunk(1000, 50, 64),
        0,
        "budget below one tiled chunk"
    );
}

#[test]
fn token_budget_and_chunked_prefill_keep_decoding_going() {
    let t0 = Instant::now();
    let mut s = sched(SchedulePolicy::Priority, 256, 256);
    s.add(1, Lane::Interactive, prompt(10, 1), t0).unwrap();
    let plan = s.schedule(t0);
    assert_eq!(ids(&plan.seqs), vec![(1, 10)]);
    assert!(plan.seqs[0].sample);
    complete(&mut s, &plan.seqs);

    // A long prompt arrives: it is chunked under the budget while 1 decodes every step.
    s.add(2, Lane::Interactive, prompt(1000, 2), t0).unwrap();
    let mut prefilled = 0;
    let mut steps = 0;
    while prefilled < 1000 {
        let plan = s.schedule(t0);
        assert_eq!(plan.seqs[0].id, 1, "the decode goes first");
        assert_eq!(plan.seqs[0].n, 1);
        assert!(plan.n_tokens() <= 256);
        let p2 = plan.seqs.iter().find(|p| p.id == 2).unwrap();
        assert!(p2.n >= 64, "chunks are at least 64 tokens");
        assert_eq!(p2.start, prefilled);
        prefilled += p2.n;
        assert_eq!(p2.sample, prefilled == 1000);
        complete(&mut s, &plan.seqs);
        steps += 1;
    }
    assert_eq!(steps, 1000usize.div_ceil(255));
    let plan = s.schedule(t0);
    assert_eq!(ids(&plan.seqs), vec![(1, 1), (2, 1)], "both decode now");
}

#[test]
fn interactive_prompt_goes_before_bulk_prefill() {
    let t0 = Instant::now();
    let mut s = sched(SchedulePolicy::Priority, 256, 512);
    s.add(1, Lane::Bulk, prompt(2000, 1), t0).unwrap();
    let plan = s.schedule(t0);
    assert_eq!(ids(&plan.seqs), vec![(1, 256)]);
    complete(&mut s, &plan.seqs);
    s.add(
        2,
        Lane::Interactive,
        prompt(100, 2),
        t0 + Duration::from_millis(10),
    )
    .unwrap();
    let plan = s.schedule(t0 + Duration::from_millis(20));
    assert_eq!(
        ids(&plan.seqs),
        vec![(2, 100)],
        "interactive alone: a short step"
    );
    assert!(plan.seqs[0].sample);
    complete(&mut s, &plan.seqs);
    let plan = s.schedule(t0 + Duration::from_millis(30));
    assert_eq!(ids(&plan.seqs), vec![(2, 1), (1, 255)], "then bulk resumes");
    // FIFO: the bulk prompt keeps the budget.
    let mut f = sched(SchedulePolicy::Fifo, 256, 512);
    f.add(1, Lane::Bulk, prompt(2000, 1), t0).unwrap();
    let plan = f.schedule(t0);
    complete(&mut f, &plan.seqs);
    f.add(
        2,
        Lane::Interactive,
        prompt(100, 2),
        t0 + Duration::from_millis(10),
    )
    .unwrap();
    let plan = f.schedule(t0 + Duration::from_millis(20));
    assert_eq!(ids(&plan.seqs), vec![(1, 256)]);
}

#[test]
fn aging_lifts_waiting_bulk_one_lane_per_period() {
    let t0 = Instant::now();
    // One slot, so only one request can be admitted per step.
    let cfg = SchedulerConfig {
        max_running: 1,
        max_batch_tokens: 256,
        ..Default::default()
    };
    let run = |bulk_age: u64| {
        let mut s = Scheduler::new(cfg.clone(), BlockManager::new(64, 16));
        let now = t0 + Duration::from_secs(100);
        s.add(
            1,
            Lane::Bulk,
            prompt(8, 1),
            now - Duration::from_secs(bulk_age),
        )
        .unwrap();
        s.add(
            2,
            Lane::Background,
            prompt(8, 2),
            now - Duration::from_secs(1),
        )
        .unwrap();
        s.add(3, Lane::Interactive, prompt(8, 3), now).unwrap();
        s.schedule(now).seqs[0].id
    };
    assert_eq!(run(5), 3, "fresh bulk waits behind everyone");
    // After 10 s bulk ranks as background (older than 2, so before it) but not interactive.
    assert_eq!(run(12), 3);
    // After 20 s bulk ranks as interactive and is older than 3.
    assert_eq!(run(21), 1);
    // Background after 10 s would also rank interactive: it is older than 3.
    let mut s = Scheduler::new(cfg.clone(), BlockManager::new(64, 16));
    let now = t0 + Duration::from_secs(100);
    s.add(
        2,
        Lane::Background,
        prompt(8, 2),
        now - Duration::from_secs(11),
    )
    .unwrap();
    s.add(
        3,
        Lane::Interactive,
        prompt(8, 3),
        now - Duration::from_secs(1),
    )
    .unwrap();
    assert_eq!(s.schedule(now).seqs[0].id, 2);
}

/// Three 32-token prompts fill a 7-block pool (2 blocks each); when they grow, the pool runs
/// out and the scheduler preempts. They arrived long ago, so aging ranks them all as
/// interactive (one step admits them all); preemption goes by their base lanes.
fn full_pool(policy: SchedulePolicy, lanes: [Lane; 3]) -> Scheduler {
    let now = Instant::now();
    let t0 = now.checked_sub(Duration::from_secs(60)).unwrap_or(now);
    let mut s = sched(policy, 256, 7);
    for (i, lane) in lanes.into_iter().enumerate() {
        let id = i as u64 + 1;
        s.add(
            id,
            lane,
            prompt(32, id as u32),
            t0 + Duration::from_millis(id),
        )
        .unwrap();
    }
    let plan = s.schedule(now);
    assert_eq!(plan.seqs.len(), 3);
    complete(&mut s, &plan.seqs);
    s
}

#[test]
fn preemption_takes_lowest_lane_most_recent_first() {
    let t = Instant::now() + Duration::from_millis(10);
    // Each decode now needs a third block; one is free.
    let mut s = full_pool(
        SchedulePolicy::Priority,
        [Lane::Bulk, Lane::Interactive, Lane::Bulk],
    );
    let plan = s.schedule(t);
    // Bulk 1 (oldest) takes the free block; interactive 2 then needs one: the most recently
    // started bulk (3) is preempted, and 2 gets its blocks.
    assert_eq!(plan.preempted, vec![3]);
    assert_eq!(ids(&plan.seqs), vec![(1, 1), (2, 1)]);
    assert_eq!(s.preemptions(), 1);
    assert_eq!(s.get(3).unwrap().n_computed, 0, "recomputed later");
    assert_eq!(
        s.get(3).unwrap().tokens.len(),
        33,
        "keeps its generated token"
    );
    assert_eq!(s.waiting_by_lane(), [0, 0, 1]);
}

#[test]
fn interactive_is_never_preempted_for_bulk() {
    let t = Instant::now() + Duration::from_millis(10);
    let mut s = full_pool(
        SchedulePolicy::Priority,
        [Lane::Interactive, Lane::Interactive, Lane::Bulk],
    );
    let plan = s.schedule(t);
    // Interactive 1 takes the free block; interactive 2 preempts bulk 3.
    assert_eq!(plan.preempted, vec![3]);
    complete(&mut s, &plan.seqs);
    // From here on, whenever the pool runs dry, an interactive sequence is only preempted
    // when no bulk sequence holds blocks (then in favour of another interactive one).
    let mut preempted = 0;
    for step in 0..60 {
        let bulk_running = s.get(3).is_some_and(|q| q.slot.is_some());
        let plan = s.schedule(t + Duration::from_millis(20 + step));
        for id in &plan.preempted {
            preempted += 1;
            if s.get(*id).unwrap().lane == Lane::Interactive {
                assert!(
                    !bulk_running,
                    "step {step}: interactive {id} preempted while bulk ran"
                );
            }
        }
        complete(&mut s, &plan.seqs);
    }
    assert!(preempted > 0, "the pool ran dry");
}

#[test]
fn fifo_preempts_most_recently_started_whatever_the_lane() {
    let t = Instant::now() + Duration::from_millis(10);
    let mut s = full_pool(
        SchedulePolicy::Fifo,
        [Lane::Bulk, Lane::Bulk, Lane::Interactive],
    );
    let plan = s.schedule(t);
    assert_eq!(plan.preempted, vec![3], "FIFO ignores lanes");
}

#[test]
fn repeated_prompt_is_admitted_from_the_prefix_cache() {
    let t0 = Instant::now();
    let mut s = sched(SchedulePolicy::Priority, 256, 64);
    let p = prompt(100, 9);
    s.add(1, Lane::Interactive, p.clone(), t0).unwrap();
    let plan = s.schedule(t0);
    complete(&mut s, &plan.seqs);
    s.finish(1);
    assert_eq!(s.kv().n_used(), 0);
    assert!(s.kv().n_cached() >= 6);
    s.add(2, Lane::Interactive, p, t0).unwrap();
    let plan = s.schedule(t0);
    assert_eq!(plan.seqs[0].start, 96, "six full blocks of 16 reused");
    assert_eq!(plan.seqs[0].n, 4);
    assert_eq!(s.get(2).unwrap().cached_tokens, 96);
    let st = s.kv().stats();
    assert_eq!((st.queried_tokens, st.hit_tokens), (200, 96));
}

#[test]
fn forked_sequences_share_blocks_until_they_write() {
    let t0 = Instant::now();
    let mut s = sched(SchedulePolicy::Priority, 256, 64);
    s.add(1, Lane::Interactive, prompt(20, 1), t0).unwrap();
    let plan = s.schedule(t0);
    // As the engine does: prompt computed, fork, then each samples its own token.
    s.on_computed(1, plan.seqs[0].n, plan.seqs[0].tiled);
    assert!(s.fork(1, 2));
    assert_eq!(s.blocks(1), s.blocks(2));
    s.append_token(1, 7);
    s.append_token(2, 8);
    let plan = s.schedule(t0);
    // Position 20 is in block 1, shared and part-full: one of the two copies it.
    assert_eq!(plan.copies.len(), 1);
    assert_eq!(s.blocks(1)[0], s.blocks(2)[0]);
    assert_ne!(s.blocks(1)[1], s.blocks(2)[1]);
}

#[test]
fn unfit_requests_are_refused() {
    let mut s = sched(SchedulePolicy::Priority, 256, 4);
    let err = s
        .add(1, Lane::Bulk, prompt(100, 1), Instant::now())
        .unwrap_err();
    assert!(err.to_string().contains("7 KV blocks"), "{err}");
    assert!(s.add(2, Lane::Bulk, vec![], Instant::now()).is_err());
}

#[test]
fn low_lanes_take_short_chunks() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default(), BlockManager::new(256, 16));
    s.add(1, Lane::Bulk, prompt(1000, 1), t0).unwrap();
    s.add(2, Lane::Interactive, prompt(1000, 2), t0).unwrap();
    let plan = s.schedule(t0);
    assert_eq!(
        ids(&plan.seqs),
        vec![(2, 256)],
        "interactive: the whole budget"
    );
    complete(&mut s, &plan.seqs);
    s.finish(2);
    let plan = s.schedule(t0);
    assert_eq!(ids(&plan.seqs), vec![(1, 128)], "bulk: at most 128 a step");
}

#[test]
fn interactive_work_shrinks_low_lane_steps() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default(), BlockManager::new(512, 16));
    s.add(1, Lane::Bulk, prompt(1000, 1), t0).unwrap();
    s.add(2, Lane::Bulk, prompt(1000, 2), t0).unwrap();
    let plan = s.schedule(t0);
    assert_eq!(
        ids(&plan.seqs),
        vec![(1, 128), (2, 128)],
        "two 128-token chunks"
    );
    assert_eq!(
        plan.prompt_lane,
        Some(Lane::Bulk),
        "abandonable by higher lanes"
    );
    complete(&mut s, &plan.seqs);

    s.add(3, Lane::Interactive, prompt(10, 3), t0).unwrap();
    let plan = s.schedule(t0);
    assert_eq!(
        ids(&plan.seqs),
        vec![(3, 10)],
        "the interactive prompt alone"
    );
    assert_eq!(plan.prompt_lane, Some(Lane::Interactive));
    complete(&mut s, &plan.seqs);
    // While 3 decodes, bulk gets one chunk of 64 a step.
    let plan = s.schedule(t0);
    assert_eq!(ids(&plan.seqs), vec![(3, 1), (1, 64)]);
    assert_eq!(plan.prompt_lane, Some(Lane::Bulk));
    complete(&mut s, &plan.seqs);
    s.finish(3);
    let plan = s.schedule(t0);
    assert_eq!(
        ids(&plan.seqs),
        vec![(1, 128), (2, 128)],
        "back to 128 each"
    );

    // A prompt too short to split (< 128 left) still goes whole under interactive load.
    let mut s = Scheduler::new(SchedulerConfig::default(), BlockManager::new(512, 16));
    s.add(1, Lane::Interactive, prompt(10, 1), t0).unwrap();
    s.add(2, Lane::Bulk, prompt(100, 2), t0).unwrap();
    let plan = s.schedule(t0);
    assert_eq!(ids(&plan.seqs), vec![(1, 10)]);
    complete(&mut s, &plan.seqs);
    let plan = s.schedule(t0);
    assert_eq!(ids(&plan.seqs), vec![(1, 1), (2, 100)]);
    complete(&mut s, &plan.seqs);
    // Decodes alone are never abandoned.
    let plan = s.schedule(t0);
    assert_eq!(ids(&plan.seqs), vec![(1, 1), (2, 1)]);
    assert_eq!(plan.prompt_lane, None);

    // FIFO never marks a step abandonable.
    let mut f = sched(SchedulePolicy::Fifo, 256, 512);
    f.add(1, Lane::Bulk, prompt(1000, 1), t0).unwrap();
    assert_eq!(f.schedule(t0).prompt_lane, None);
}

#[test]
fn drafts_are_verified_with_variable_acceptance_and_rolled_back() {
    let t0 = Instant::now();
    let mut s = sched(SchedulePolicy::Priority, 256, 64);
    let p = prompt(30, 5);
    s.add(1, Lane::Interactive, p.clone(), t0).unwrap();
    assert!(
        !s.set_draft(1, &[1, 2]),
        "no draft while the prompt is waiting"
    );
    let plan = s.schedule(t0);
    complete(&mut s, &plan.seqs);
    assert_eq!(s.kv().n_used(), 2);

    // A draft of 5: the last token and the draft in one step, logits at all six.
    assert!(s.set_draft(1, &[11, 12, 13, 14, 15]));
    assert_eq!(s.get(1).unwrap().draft(), &[11, 12, 13, 14, 15]);
    let plan = s.schedule(t0);
    assert_eq!(ids(&plan.seqs), vec![(1, 6)]);
    assert_eq!((plan.seqs[0].start, plan.seqs[0].draft), (30, 5));
    assert!(plan.seqs[0].sample);
    assert_eq!(s.kv().n_used(), 3, "positions 30..36 reach a third block");
    // An abandoned step changes nothing: the same step is planned again.
    let again = s.schedule(t0);
    assert_eq!(again.seqs, plan.seqs);
    s.on_computed(1, 6, false);
    assert_eq!(
        s.kv().n_cached(),
        1,
        "block 1 holds drafted tokens: not cached before they are confirmed"
    );
    // Two drafted tokens stand, three are dropped.
    s.accept_draft(1, 2);
    let q = s.get(1).unwrap();
    assert_eq!((q.tokens.len(), q.n_computed, q.n_draft), (33, 33, 0));
    assert_eq!(&q.tokens[30..], &[7, 11, 12]);
    assert_eq!(s.kv().n_cached(), 2, "block 1 (0..32) confirmed and cached");
    s.append_token(1, 20);

    // A long draft, all rejected: the block it took is released.
    let long: Vec<u32> = (100..115).collect();
    assert!(s.set_draft(1, &long));
    let plan = s.schedule(t0);
    assert_eq!(ids(&plan.seqs), vec![(1, 16)]);
    assert_eq!(s.kv().n_used(), 4, "positions 33..49 reach a fourth block");
    s.on_computed(1, 16, false);
    s.accept_draft(1, 0);
    let q = s.get(1).unwrap();
    assert_eq!((q.tokens.len(), q.n_computed), (34, 34));
    assert_eq!(s.kv().n_used(), 3);
    s.append_token(1, 21);
    let plan = s.schedule(t0);
    assert_eq!(ids(&plan.seqs), vec![(1, 1)]);
    assert_eq!(plan.seqs[0].draft, 0);
    complete(&mut s, &plan.seqs);

    // The rejected drafts never reached the prefix cache: a prompt continuing with them
    // (block 2 then holds what the sequence's block 2 held during the step) finds the two
    // confirmed blocks only.
    let mut known = s.get(1).unwrap().tokens.clone();
    s.finish(1);
    assert_eq!(s.kv().n_used(), 0);
    known.truncate(34);
    known.extend(&long);
    known.push(1);
    s.add(2, Lane::Interactive, known, t0).unwrap();
    let plan = s.schedule(t0);
    assert_eq!(plan.seqs[0].start, 32);
}

#[test]
fn drafts_never_preempt_and_yield_to_the_budget() {
    let t0 = Instant::now();
    // Two 16-token prompts in a pool of 4 blocks: their decodes take all four.
    let mut s = sched(SchedulePolicy::Priority, 256, 4);
    s.add(1, Lane::Interactive, prompt(16, 1), t0).unwrap();
    s.add(2, Lane::Interactive, prompt(16, 2), t0).unwrap();
    let plan = s.schedule(t0);
    complete(&mut s, &plan.seqs);
    assert!(s.set_draft(1, &[1; 20]));
    let plan = s.schedule(t0);
    assert!(
        plan.preempted.is_empty(),
        "a draft takes no other sequence's block"
    );
    assert_eq!(ids(&plan.seqs), vec![(1, 1), (2, 1)]);
    assert_eq!(s.get(1).unwrap().n_draft, 0, "dropped");
    complete(&mut s, &plan.seqs);

    // A draft larger than the step budget is dropped too; one that fits is scheduled
    // after every plain decode.
    let mut s = sched(SchedulePolicy::Priority, 256, 64);
    s.add(1, Lane::Interactive, prompt(16, 1), t0).unwrap();
    s.add(2, Lane::Interactive, prompt(16, 2), t0).unwrap();
    let plan = s.schedule(t0);
    complete(&mut s, &plan.seqs);
    assert!(s.set_draft(1, &[1; 255]));
    let plan = s.schedule(t0);
    assert_eq!(ids(&plan.seqs), vec![(1, 1), (2, 1)]);
    complete(&mut s, &plan.seqs);
    assert!(s.set_draft(1, &[1; 254]));
    let plan = s.schedule(t0);
    assert_eq!(ids(&plan.seqs), vec![(1, 255), (2, 1)]);
    assert_eq!(plan.n_tokens(), 256);

    // A preempted sequence loses its draft (it is recomputed as a prompt).
    let mut s = full_pool(
        SchedulePolicy::Priority,
        [Lane::Bulk, Lane::Interactive, Lane::Bulk],
    );
    assert!(s.set_draft(3, &[9, 9]));
    let plan = s.schedule(Instant::now() + Duration::from_millis(10));
    assert_eq!(plan.preempted, vec![3]);
    let q = s.get(3).unwrap();
    assert_eq!((q.tokens.len(), q.n_draft, q.n_computed), (33, 0, 0));
}
