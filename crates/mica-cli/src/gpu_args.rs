//! `--gpu-layers N|all` of `run`, `chat` and `serve`: the last `N` layers (all of them with `all`)
//! and the output head run on the first CUDA GPU (`mica_cuda`), the rest on the CPU, as
//! llama.cpp's `-ngl`. The placement is checked against the GPU's free memory before
//! anything is uploaded; `0` (the default) keeps everything on the CPU.

use anyhow::{Context, Result};
use clap::Args;
use mica::models::{LayerOffload, LoadedModel, Model};
use mica_cuda::{Cuda, GpuDecoder, GpuLayers};
use mica_server::Offloader;
use std::sync::Arc;

#[derive(Args, Debug, Clone, Default)]
pub struct GpuArgs {
    /// Layers to run on the GPU, the last ones (with the output head): a number or `all`
    /// (llama.cpp's -ngl). 0: none (the default).
    #[arg(long = "gpu-layers", value_name = "N|all", value_parser = parse_layers)]
    pub gpu_layers: Option<GpuLayers>,
}

fn parse_layers(s: &str) -> Result<GpuLayers, String> {
    s.parse()
}

impl GpuArgs {
    /// The offload for `model` with caches of `n_blocks` blocks per layer and steps of up
    /// to `max_tokens` tokens; `None` when no layer goes to the GPU.
    pub fn offload(
        &self,
        model: &Model,
        n_blocks: usize,
        max_tokens: usize,
    ) -> Result<Option<Box<dyn LayerOffload + Send>>> {
        match self.layers() {
            None => Ok(None),
            Some(l) => place(l, model, n_blocks, max_tokens).map(Some),
        }
    }

    /// What `serve` places each model it loads with; `None` when no layer goes to the GPU.
    pub fn offloader(&self) -> Option<Offloader> {
        let layers = self.layers()?;
        let name = match layers {
            GpuLayers::All => "--gpu-layers all".to_string(),
            GpuLayers::Last(n) => format!("--gpu-layers {n}"),
        };
        Some(Offloader {
            name,
            place: Arc::new(move |model, n_blocks, max_tokens| {
                place(layers, model, n_blocks, max_tokens)
                    .map(Some)
                    .map_err(|e| format!("{e:#}"))
            }),
        })
    }

    fn layers(&self) -> Option<GpuLayers> {
        match self.gpu_layers {
            None | Some(GpuLayers::Last(0)) => None,
            Some(l) => Some(l),
        }
    }
}

/// Drops from the process the weights the GPU now holds (layers `first..` and a separate
/// head), logging how much.
pub fn evict(lm: &mut LoadedModel, first: usize) {
    let bytes = lm.model.evict_offloaded(first);
    log::info!(
        "gpu: {:.1} MiB of weights dropped from host memory (held on the GPU)",
        bytes as f64 / (1u64 << 20) as f64
    );
}

/// Layers `layers` of `model` and its head, placed on the first CUDA GPU.
fn place(
    layers: GpuLayers,
    model: &Model,
    n_blocks: usize,
    max_tokens: usize,
) -> Result<Box<dyn LayerOffload + Send>> {
    let cuda = Cuda::open(0).context("--gpu-layers")?;
    let first = layers.first(model.layers.len());
    log::info!(
        "gpu: {} (compute {}.{}): layers {first}..{} and the output head",
        cuda.name(),
        cuda.capability().0,
        cuda.capability().1,
        model.layers.len()
    );
    let dec = GpuDecoder::place(Arc::new(cuda), model, layers, n_blocks, max_tokens)
        .context("--gpu-layers")?;
    Ok(Box::new(dec))
}
