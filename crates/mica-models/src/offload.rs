//! The seam a device backend plugs into: the last layers of a model (from
//! [`LayerOffload::first_layer`] to the end) and its output head run on another device,
//! the rest of the forward pass on the host.
//!
//! [`Model::forward_offloaded`](crate::Model::forward_offloaded) embeds the batch and runs
//! the host's layers, hands the residual stream to [`LayerOffload::run_layers`], then keeps
//! the output rows, applies the final norm and asks [`LayerOffload::head`] for the logits
//! (computing them itself when the offload declines). The offloaded layers' keys and values
//! live in the offload's memory at the rows the host [`KvCache`]'s block tables give, so
//! sequences, prefixes shared by copy-on-write blocks, truncation and rollback stay the host
//! cache's business: the offload mirrors [`KvCache::copy_block`] through
//! [`LayerOffload::copy_block`], and a cache made with [`KvCache::new_offloaded`] or
//! [`KvCache::paged_offloaded`] holds no storage for the offloaded layers.
//!
//! As llama.cpp's `-ngl N`, the offloaded layers are the last ones: the first layers, the
//! embedding lookup and everything a device backend does not run stay on the host.

use crate::{Batch, KvCache, Result};

/// The last layers of a model and its output head, run elsewhere.
pub trait LayerOffload {
    /// The first layer it runs; it runs every later one too.
    fn first_layer(&self) -> usize;

    /// Runs its layers over the batch's residual stream `x` (`[n × n_embd]`, replaced by
    /// the last layer's output), writing and reading its layers' keys and values at the
    /// rows of `kv`'s block tables (room for the batch already reserved there).
    fn run_layers(&mut self, batch: &Batch, kv: &KvCache, x: &mut [f32]) -> Result<()>;

    /// The output head's logits (`[n × n_vocab]`, before any final soft-capping) of `n`
    /// final-normed rows `h`; `Ok(false)`: it does not hold the head, the host computes it.
    fn head(&mut self, h: &[f32], n: usize, logits: &mut [f32]) -> Result<bool>;

    /// Copies block `src` of its layers' caches into block `dst`, as
    /// [`KvCache::copy_block`] does for the host's.
    fn copy_block(&mut self, src: u32, dst: u32) -> Result<()>;
}
