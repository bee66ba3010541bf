//! A forward pass's turns through the streamed units ([`Pass`]), and the output head's
//! product when the head streams in chunks.

use super::{LayerStream, StreamMode};
use crate::error::{ModelError, Result};
use crate::model::grow;
use crate::weights::ActCache;
use mica_kernels::ThreadPool;
use std::sync::MutexGuard;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// One forward pass's walk through the layers ([`LayerStream::begin_pass`]).
pub(crate) struct Pass<'a> {
    pub(super) stream: &'a LayerStream,
    pub(super) cursor: MutexGuard<'a, super::Cursor>,
}

impl Pass<'_> {
    /// Ends the previous unit's turn and, when `layer` (a layer, or `n_layers + c` for the
    /// head's chunk `c`) is streamed, begins its turn: its bytes are in its slot when this
    /// returns. Units must come in increasing order; streamed units skipped are taken and
    /// given back (overlapped) or skipped (sync).
    pub(crate) fn enter(&mut self, layer: usize) -> Result<()> {
        self.leave();
        let Some(j) = self.stream.order.get(layer).copied().flatten() else {
            return Ok(());
        };
        let m = self.stream.ring.reads.len() as u64;
        let j = j as u64;
        assert!(
            self.cursor.next % m <= j,
            "unit {layer} entered after a later streamed unit"
        );
        while self.cursor.next % m < j {
            self.skip()?;
        }
        let t = self.cursor.next;
        self.take(t)?;
        self.cursor.held = Some(t);
        self.cursor.next += 1;
        Ok(())
    }

    /// Ends the current layer's turn, if any.
    pub(crate) fn leave(&mut self) {
        if let Some(t) = self.cursor.held.take() {
            self.stream.ring.release(t);
        }
    }

    /// Whether the pass computes the output head in chunks, each in its turn
    /// ([`Pass::head_logits`]).
    pub(crate) fn streams_head(&self) -> bool {
        self.stream.streams_head()
    }

    /// The streamed output head's product of the `n_out` rows of `xn` into `logits`
    /// (`[n_out, n_vocab]`): each chunk of rows in its turn, its products into `part`,
    /// scattered into each output row's logits.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn head_logits(
        &mut self,
        pool: &ThreadPool,
        acts: &mut ActCache,
        xn: &[f32],
        n_out: usize,
        n_vocab: usize,
        part: &mut Vec<f32>,
        logits: &mut [f32],
    ) -> Result<()> {
        let stream = self.stream;
        for (unit, r0, chunk) in stream.head_chunks() {
            self.enter(unit)?;
            let rows = chunk.out_dim();
            let part = grow(part, n_out * rows);
            chunk.forward(pool, acts.get(pool, &chunk.w, xn, n_out), part);
            for (t, p) in part.chunks_exact(rows).enumerate() {
                let at = t * n_vocab + r0;
                logits[at..at + rows].copy_from_slice(p);
            }
        }
        Ok(())
    }

    /// Takes ticket `t`: waits for the IO thread, or reads it (sync).
    fn take(&mut self, t: u64) -> Result<()> {
        let ring = &self.stream.ring;
        let t0 = Instant::now();
        let r = match self.stream.mode {
            StreamMode::Overlapped => ring.acquire(t),
            StreamMode::Sync => {
                if !ring.begin_fill(t) {
                    return Err(ModelError::Streaming("the stream was shut down".into()));
                }
                let r = ring.fill(t);
                ring.end_fill(t, r);
                ring.acquire(t)
            }
        };
        let ns = t0.elapsed().as_nanos() as u64;
        ring.wait_ns.fetch_add(ns, Ordering::Relaxed);
        r
    }

    /// Passes over the next streamed layer without computing it.
    fn skip(&mut self) -> Result<()> {
        let t = self.cursor.next;
        if self.stream.mode == StreamMode::Overlapped {
            // The IO thread reads every ticket in order: take it to let it go on.
            self.take(t)?;
            self.stream.ring.release(t);
        }
        self.cursor.next += 1;
        Ok(())
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.leave();
        let m = self.stream.ring.reads.len() as u64;
        while !self.cursor.next.is_multiple_of(m) {
            if self.skip().is_err() {
                // The stream failed: every later pass reports it.
                self.cursor.next = self.cursor.next.next_multiple_of(m);
            }
        }
    }
}
