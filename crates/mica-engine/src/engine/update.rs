//! The update phase of an engine step: per scheduled sequence, record what the step
//! computed, choose the next tokens with the sequence's decoder (a drafted run verified in
//! one go), stream them, then finish the sequence, or roll back its rejected draft and ask
//! its proposer for the next one. Also the end of requests (finished, failed, cancelled)
//! and the metrics published after each step.

use super::{Choice, Core, Group};
use crate::decoder::SequenceDecoder;
use crate::generate::{FinishReason, GenerateParams};
use crate::metrics::RequestStatus;
use crate::proposer::StepLoad;
use crate::request::{Event, ProcessorFactory, RequestError, TokenLogprob};
use crate::sampler::log_softmax;
use crate::scheduler::{Lane, ReqId, Scheduled};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// How a sequence's tokens of one step ended.
enum Outcome {
    /// Still generating.
    Continue,
    /// One of the tokens ended it.
    Finish(FinishReason),
    /// The client went away.
    Cancelled,
}

impl Core {
    /// Updates every sequence of a step that ran: `self.logits` holds, in plan order, the
    /// rows of each sequence that samples (its last token, then its drafted tokens).
    pub(super) fn update(&mut self, seqs: &[Scheduled], now: Instant) {
        let n_vocab = self.model.model.config.n_vocab;
        let mut row = 0;
        let mut generated = 0;
        let all_logits = std::mem::take(&mut self.logits);
        let load = StepLoad {
            tokens: seqs.iter().map(|s| s.n).sum(),
            sequences: seqs.iter().filter(|s| s.sample).count(),
        };
        for s in seqs {
            self.sched.on_computed(s.id, s.n, s.tiled);
            if !s.sample {
                continue;
            }
            let rows = row * n_vocab..(row + 1 + s.draft) * n_vocab;
            row += 1 + s.draft;
            let Some(g) = self.choices.get(&s.id).map(|c| c.group) else {
                continue;
            };
            // Completions beyond the first share the prompt's blocks from here on.
            let forks = self.groups.get(&g).map_or(0, |gr| gr.to_fork);
            let mut ids = vec![s.id];
            if forks > 0 {
                ids.extend(self.fork_group(g, s.id));
            }
            for id in ids {
                generated += self.decode_step(id, &all_logits[rows.clone()], load);
            }
        }
        self.logits = all_logits;
        self.record_rate(now, generated);
    }

    /// The decoder of completion `index` of a request (each completion its own seed).
    pub(super) fn new_decoder(
        &self,
        index: usize,
        params: &GenerateParams,
        processors: Option<&ProcessorFactory>,
        prompt: &[u32],
    ) -> SequenceDecoder {
        let mut params = params.clone();
        params.sampling.seed = params.sampling.seed.wrapping_add(index as u64);
        let mut d = SequenceDecoder::new(&self.model.tokenizer, &params, prompt, self.n_ctx);
        for p in processors.map(|f| f(index)).unwrap_or_default() {
            d.push_processor(p);
        }
        d
    }

    /// Creates the other completions of group `g` as forks of `parent`.
    fn fork_group(&mut self, g: ReqId, parent: ReqId) -> Vec<ReqId> {
        let Some(group) = self.groups.get_mut(&g) else {
            return Vec::new();
        };
        let n = group.n;
        group.to_fork = 0;
        let Some(prompt) = self
            .choices
            .get(&parent)
            .map(|c| c.decoder.history().to_vec())
        else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for index in 1..n {
            let child = g + index as u64;
            if self.sched.fork(parent, child) {
                // A hybrid model's fork continues from the parent's recurrent state.
                let slot = |id| self.sched.get(id).and_then(|s| s.slot);
                if let (Some(p), Some(c)) = (slot(parent), slot(child)) {
                    self.kv.copy_state(p, c);
                }
                out.push(child);
            } else {
                // No free slot: the completion queues on its own (its prompt then hits the
                // prefix cache).
                let tokens = self.sched.get(parent).map(|s| s.tokens.clone());
                let lane = self.groups[&g].lane;
                if let Some(t) = tokens
                    && self.sched.add(child, lane, t, Instant::now()).is_err()
                {
                    continue;
                }
            }
            let group = &self.groups[&g];
            let decoder =
                self.new_decoder(index, &group.params, group.processors.as_ref(), &prompt);
            let c = Choice {
                group: g,
                index,
                decoder,
                last_token_at: None,
                draft_dists: Vec::new(),
            };
            self.choices.insert(child, c);
            if let Some(group) = self.groups.get_mut(&g) {
                group.live += 1;
            }
        }
        out
    }

    /// Chooses, streams and records the tokens of sequence `id` from `rows`
    /// (`[1 + draft, n_vocab]`: logits at its last token and at each of its drafted
    /// tokens): the drafted tokens the model agrees with, then its own next token. Finishes
    /// the sequence when one of them ends it; otherwise rolls back the rejected part of the
    /// draft, appends the new token and asks for the next draft. Returns the tokens produced.
    fn decode_step(&mut self, id: ReqId, rows: &[f32], load: StepLoad) -> usize {
        let Some(seq) = self.sched.get(id) else {
            return 0;
        };
        let draft = seq.draft();
        let n_draft = draft.len();
        let Some(choice) = self.choices.get_mut(&id) else {
            return 0;
        };
        let Some(group) = self.groups.get_mut(&choice.group) else {
            return 0;
        };
        let mut chosen = std::mem::take(&mut self.chosen);
        // The distributions stored with the draft, if it is the one the step verified.
        let dists = std::mem::take(&mut choice.draft_dists);
        let dists = if dists.len() == n_draft {
            dists
        } else {
            Vec::new()
        };
        choice.decoder.choose_with(rows, draft, &dists, &mut chosen);
        let n_vocab = rows.len() / (1 + n_draft);
        let mut outcome = Outcome::Continue;
        let mut produced = 0;
        for (i, &token) in chosen.iter().enumerate() {
            let row = &rows[i * n_vocab..(i + 1) * n_vocab];
            let logprob = group.logprobs.map(|k| token_logprob(row, token, k));
            let commit = choice.decoder.commit(token);
            produced += 1;
            group.usage.completion_tokens += 1;
            self.metrics.generated_tokens.fetch_add(1, Relaxed);
            if !group.first_token {
                group.first_token = true;
                let ttft = Instant::now().saturating_duration_since(group.arrival);
                self.metrics.ttft[group.lane.index()].observe(ttft.as_secs_f64());
            }
            let at = Instant::now();
            if let Some(prev) = choice.last_token_at {
                self.metrics
                    .tpot
                    .observe(at.duration_since(prev).as_secs_f64());
            }
            choice.last_token_at = Some(at);
            let alive = group.sink.send(Event::Token {
                index: choice.index,
                token,
                text: commit.text,
                logprob,
            });
            if !alive {
                outcome = Outcome::Cancelled;
                break;
            }
            if let Some(f) = commit.finish {
                outcome = Outcome::Finish(f);
                break;
            }
        }
        if n_draft > 0 {
            let m = &self.metrics;
            m.draft_tokens.fetch_add(n_draft as u64, Relaxed);
            m.accepted_draft_tokens
                .fetch_add(chosen.len() as u64 - 1, Relaxed);
            group.usage.draft_tokens += n_draft;
            group.usage.accepted_draft_tokens += chosen.len() - 1;
        }
        let g = choice.group;
        match outcome {
            Outcome::Cancelled => {
                self.end_group(g, RequestStatus::Cancelled);
            }
            Outcome::Finish(f) => self.finish_choice(id, f),
            Outcome::Continue => {
                if n_draft > 0 {
                    self.sched.accept_draft(id, chosen.len() - 1);
                }
                if let Some(&last) = chosen.last() {
                    self.sched.append_token(id, last);
                }
                self.propose(id, load);
            }
        }
        self.chosen = chosen;
        produced
    }

    /// Tells the request's proposer the step's load and asks it for a draft to follow
    /// sequence `id`.
    fn propose(&mut self, id: ReqId, load: StepLoad) {
        let Some(choice) = self.choices.get_mut(&id) else {
            return;
        };
        let Some(proposer) = self
            .groups
            .get_mut(&choice.group)
            .and_then(|g| g.proposer.as_deref_mut())
        else {
            return;
        };
        let max = choice.decoder.max_draft();
        if max == 0 {
            return;
        }
        proposer.step_load(load);
        let dec = &choice.decoder;
        let mut draft = proposer.draft(dec.history(), max, dec.sampling());
        draft.truncate(max);
        choice.decoder.forced_draft(&mut draft);
        if !draft.is_empty() && self.sched.set_draft(id, &draft.tokens) {
            choice.decoder.prefetch(&draft.tokens);
            choice.draft_dists = draft.dists;
        }
    }

    /// Ends one completion; the group ends with its last one.
    fn finish_choice(&mut self, id: ReqId, finish: FinishReason) {
        self.sched.finish(id);
        let Some(mut choice) = self.choices.remove(&id) else {
            return;
        };
        let Some(group) = self.groups.get_mut(&choice.group) else {
            return;
        };
        let text = choice.decoder.tail(finish);
        group.sink.send(Event::Done {
            index: choice.index,
            finish,
            text,
        });
        group.live -= 1;
        if group.live == 0 && group.to_fork == 0 {
            let usage = group.usage;
            // Counted before the client hears the end, so metrics read after a response
            // already include it.
            if let Some(mut group) = self.end_group(choice.group, RequestStatus::Ok) {
                group.sink.send(Event::Finished { usage });
            }
        }
    }

    pub(super) fn fail_group(&mut self, g: ReqId, error: RequestError) {
        if let Some(group) = self.groups.get_mut(&g) {
            group.sink.send(Event::Error(error));
        }
        self.end_group(g, RequestStatus::Error);
    }

    /// Removes a request and every sequence of it, freeing their blocks.
    /// Returns the removed request, if it was still there.
    pub(super) fn end_group(&mut self, g: ReqId, status: RequestStatus) -> Option<Group> {
        let ids: Vec<ReqId> = self
            .choices
            .iter()
            .filter(|(_, c)| c.group == g)
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.sched.finish(id);
            self.choices.remove(&id);
        }
        let group = self.groups.remove(&g)?;
        if !group.admitted {
            self.queued[group.lane.index()].fetch_sub(1, Relaxed);
        }
        self.metrics.count_request(group.lane, status);
        Some(group)
    }

    fn record_rate(&mut self, now: Instant, generated: usize) {
        self.recent.push_back((now, generated));
        while self
            .recent
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > Duration::from_secs(5))
        {
            self.recent.pop_front();
        }
        let span = self
            .recent
            .front()
            .map_or(0.0, |(t, _)| now.duration_since(*t).as_secs_f64());
        let total: usize = self.recent.iter().map(|(_, n)| n).sum();
        self.metrics
            .set_tokens_per_s(if span > 0.0 { total as f64 / span } else { 0.0 });
    }

    /// Copies scheduler and cache state into the metrics.
    pub(super) fn publish(&self) {
        let m = &self.metrics;
        let w = self.sched.waiting_by_lane();
        for lane in Lane::ALL {
            m.waiting[lane.index()].store(w[lane.index()] as u64, Relaxed);
        }
        m.running.store(self.sched.n_running() as u64, Relaxed);
        let kv = self.sched.kv();
        m.kv_blocks_used.store(kv.n_used() as u64, Relaxed);
        m.kv_blocks_cached.store(kv.n_cached() as u64, Relaxed);
        if let Some(ck) = kv.checkpoints() {
            m.state_checkpoints_total
                .store(ck.capacity() as u64, Relaxed);
            m.state_checkpoints_cached
                .store(ck.n_committed() as u64, Relaxed);
        }
        let st = kv.stats();
        m.prefix_queried_tokens.store(st.queried_tokens, Relaxed);
        m.prefix_hit_tokens.store(st.hit_tokens, Relaxed);
    }
}

/// Log-probability of `token` and the `k` most likely tokens, from raw logits.
fn token_logprob(logits: &[f32], token: u32, k: usize) -> TokenLogprob {
    let lp = log_softmax(logits);
    let mut top: Vec<(u32, f32)> = Vec::new();
    if k > 0 {
        let mut idx: Vec<u32> = (0..lp.len() as u32).collect();
        let k = k.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| {
            lp[b as usize].total_cmp(&lp[a as usize]).then(a.cmp(&b))
        });
        idx.truncate(k);
        idx.sort_by(|&a, &b| lp[b as usize].total_cmp(&lp[a as usize]).then(a.cmp(&b)));
        top = idx.into_iter().map(|i| (i, lp[i as usize])).collect();
    }
    TokenLogprob {
        logprob: lp[token as usize],
        top,
    }
}
