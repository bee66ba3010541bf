//! The model's weights as a whole: enumerating its matrices and projections, repacking
//! them, dropping those another device holds, truncating layers, counting bytes.

use super::layer::{expert_matrices, layer_linears, layer_matrices_mut};
use super::{DecoderLayer, Ffn, Mla, Model};
use crate::weights::{Linear, Matrix};

impl Model {
    /// The weight matrices (the output head only when it is not the token embedding).
    pub(crate) fn matrices(&self) -> impl Iterator<Item = &Matrix> {
        let layers = self.layers.iter().flat_map(move |l| {
            let delta = l.delta.iter().flat_map(|d| [&d.z, &d.beta, &d.alpha]);
            let attn = [Some(&l.wq), l.wk.as_ref(), l.wv.as_ref(), Some(&l.wo)]
                .into_iter()
                .flatten()
                .chain(delta)
                .chain(l.mla.iter().flat_map(Mla::linears))
                .map(|lin| &lin.w);
            let ffn: Vec<&Matrix> = match &l.ffn {
                Ffn::Dense(e) => expert_matrices(e).to_vec(),
                Ffn::Moe(m) => std::iter::once(&m.router.w)
                    .chain(m.experts.iter().chain(&m.shared).flat_map(expert_matrices))
                    .chain(m.shared_gate.as_ref().map(|g| &g.w))
                    .collect(),
                Ffn::Plain { up, down } => vec![&up.w, &down.w],
            };
            let ple = l.ple.iter().flat_map(|p| [&p.gate.w, &p.proj.w]);
            attn.into_iter().chain(ffn).chain(ple)
        });
        let head = (self.output.w.name != self.tok_embd.name).then_some(&self.output.w);
        let ple = self.ple.iter().flat_map(|p| [&p.tok, &p.proj.w]);
        let proj = self
            .embd_proj
            .iter()
            .flat_map(|p| [&p.input.w, &p.output.w]);
        std::iter::once(&self.tok_embd)
            .chain(&self.pos_embd)
            .chain(ple)
            .chain(proj)
            .chain(layers)
            .chain(head)
    }

    /// Every weight matrix but the embedding tables, mutably (the output head included when it
    /// is the token embedding: its copy in `output` is the one products use).
    fn product_matrices_mut(&mut self) -> impl Iterator<Item = &mut Matrix> {
        let layers = self.layers.iter_mut().flat_map(layer_matrices_mut);
        let ple = self.ple.as_mut().map(|p| &mut p.proj.w);
        let proj = self
            .embd_proj
            .iter_mut()
            .flat_map(|p| [&mut p.input.w, &mut p.output.w]);
        ple.into_iter()
            .chain(proj)
            .chain(layers)
            .chain(std::iter::once(&mut self.output.w))
    }

    /// Every weight matrix named `name` (canonical, GGUF-style), mutably: the token
    /// embedding and, when tied, its copy in the output head are both returned.
    pub fn matrices_named_mut(&mut self, name: &str) -> Vec<&mut Matrix> {
        self.all_matrices_mut()
            .into_iter()
            .filter(|m| m.name == name)
            .collect()
    }

    /// Every weight matrix, mutably: the embedding tables, the layers' and the output head
    /// (twice the same name when the head is the tied token embedding).
    pub fn all_matrices_mut(&mut self) -> Vec<&mut Matrix> {
        let Model {
            tok_embd,
            pos_embd,
            ple,
            layers,
            output,
            embd_proj,
            ..
        } = self;
        let ple = ple.iter_mut().flat_map(|p| [&mut p.tok, &mut p.proj.w]);
        let proj = embd_proj
            .iter_mut()
            .flat_map(|p| [&mut p.input.w, &mut p.output.w]);
        std::iter::once(tok_embd)
            .chain(pos_embd.as_mut())
            .chain(ple)
            .chain(proj)
            .chain(layers.iter_mut().flat_map(layer_matrices_mut))
            .chain(std::iter::once(&mut output.w))
            .collect()
    }

    /// Every projection that runs through [`Linear::apply`] (so can take a LoRA update):
    /// attention, dense feed-forward and per-layer-embedding projections, the embedding
    /// projections and an output head that is not the token embedding. (Experts and
    /// routers run their own products.)
    pub fn linears(&self) -> Vec<&Linear> {
        let proj = self.embd_proj.iter().flat_map(|p| [&p.input, &p.output]);
        let ple = self.ple.iter().map(|p| &p.proj);
        let head = (self.output.w.name != self.tok_embd.name).then_some(&self.output);
        proj.chain(ple)
            .chain(self.layers.iter().flat_map(layer_linears))
            .chain(head)
            .collect()
    }

    /// [`Model::linears`], mutably.
    pub fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let tied = self.output.w.name == self.tok_embd.name;
        let Model {
            embd_proj,
            ple,
            layers,
            output,
            ..
        } = self;
        let proj = embd_proj
            .iter_mut()
            .flat_map(|p| [&mut p.input, &mut p.output]);
        let ple = ple.iter_mut().map(|p| &mut p.proj);
        let layers = layers.iter_mut().flat_map(|l| {
            let l: &mut DecoderLayer = l;
            let DecoderLayer {
                wq,
                wk,
                wv,
                wo,
                delta,
                ffn,
                ple,
                ..
            } = l;
            let delta = delta
                .iter_mut()
                .flat_map(|d| [&mut d.z, &mut d.beta, &mut d.alpha]);
            let ffn: Vec<&mut Linear> = match ffn {
                Ffn::Dense(e) => vec![&mut e.gate, &mut e.up, &mut e.down],
                Ffn::Plain { up, down } => vec![up, down],
                Ffn::Moe(_) => Vec::new(),
            };
            let ple = ple.iter_mut().flat_map(|p| [&mut p.gate, &mut p.proj]);
            [Some(wq), wk.as_mut(), wv.as_mut(), Some(wo)]
                .into_iter()
                .flatten()
                .chain(delta)
                .chain(ffn)
                .chain(ple)
        });
        let head = (!tied).then_some(output);
        proj.chain(ple).chain(layers).chain(head).collect()
    }

    /// Repacks every weight matrix the products read into this CPU's packed layout, where
    /// the kernels have one ([`Matrix::repack`]; results stay bit-identical), giving the
    /// file's pages of the repacked matrices back to the OS so the model is not resident
    /// twice. Returns the bytes of the packed copies.
    pub fn repack(&mut self) -> usize {
        // (Streamed matrices are skipped: see `Matrix::repack`.)
        let _span = tracing::trace_span!("repack").entered();
        self.product_matrices_mut().map(|m| m.repack(true)).sum()
    }

    /// Drops from this process the weights of layers `first..` and of a separate output
    /// head, once a [`LayerOffload`] holds them on another device: their packed copies, and
    /// the resident pages of the file where they are mapped. Returns the bytes dropped.
    /// The model then runs only through [`Model::forward_offloaded`] with an offload from
    /// `first` or earlier; any other pass is refused with [`ModelError::Offload`]. A head
    /// tied to the embedding stays (the host looks tokens up in it).
    pub fn evict_offloaded(&mut self, first: usize) -> usize {
        let first = first.min(self.layers.len());
        let tied = self.output.w.name == self.tok_embd.name;
        let mut bytes: usize = self.layers[first..]
            .iter_mut()
            .flat_map(layer_matrices_mut)
            .map(Matrix::evict)
            .sum();
        if !tied {
            bytes += self.output.w.evict();
        }
        self.evicted_from = Some(self.evicted_from.map_or(first, |f| f.min(first)));
        bytes
    }

    /// Keeps only the first `n` decoder layers (1 ≤ `n` ≤ the model's), the output norm and
    /// head applied right after them: an early-exit copy of the model, cheaper per token,
    /// usable as its own draft model for speculative decoding ("self-speculation"). Returns
    /// false, changing nothing, when `n` is out of range.
    pub fn truncate_layers(&mut self, n: usize) -> bool {
        // A streamed model's ring reads every streamed layer in turn.
        if n == 0 || n > self.layers.len() || self.stream.is_some() {
            return false;
        }
        self.layers.truncate(n);
        self.config.keep_layers(n);
        true
    }

    /// The weight matrices of layer `l`, mutably.
    pub(crate) fn layer_matrices_mut(&mut self, l: usize) -> impl Iterator<Item = &mut Matrix> {
        layer_matrices_mut(&mut self.layers[l])
    }

    /// Bytes of the weight matrices as stored.
    pub fn weight_bytes(&self) -> usize {
        self.matrices().map(Matrix::n_bytes).sum()
    }

    /// Whether every weight matrix is stored as f32 (a float32 checkpoint).
    pub fn float32_weights(&self) -> bool {
        self.matrices().all(|m| m.dtype == mica_kernels::DType::F32)
    }

    /// Number of weights in the matrices (norms and biases aside).
    pub fn n_params(&self) -> usize {
        self.matrices().map(|m| m.rows * m.cols).sum()
    }
}
