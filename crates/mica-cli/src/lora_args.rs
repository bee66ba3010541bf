//! `--lora [NAME=]PATH[:SCALE]` of `run`, `chat` and `serve`: LoRA adapters applied unmerged
//! to the model (PEFT folders or llama.cpp GGUF LoRA files; see `mica_models::lora`) — by
//! `run` and `chat` to every token, by `serve` to the requests that select them.

use anyhow::{Context, Result};
use clap::Args;
use mica::models::{LoadedModel, LoraSpec};

#[derive(Args, Debug, Clone, Default)]
pub struct LoraArgs {
    /// LoRA adapter applied unmerged, at an optional scale (default 1): a PEFT folder
    /// (adapter_config.json + adapter_model.safetensors) or a GGUF LoRA file. Repeatable:
    /// the updates add up. `serve` applies each only to the requests that select it (by
    /// NAME, default the file's or folder's name, or by its place: id 0, 1, …; SCALE is
    /// their default scale). (`mica convert --lora` merges one into a new file instead.)
    #[arg(long = "lora", value_name = "[NAME=]PATH[:SCALE]")]
    pub lora: Vec<LoraSpec>,
}

impl LoraArgs {
    /// Applies every adapter to `lm`, reporting each on stderr unless `quiet`.
    pub fn apply(&self, lm: &mut LoadedModel, quiet: bool) -> Result<()> {
        for spec in &self.lora {
            let a = lm
                .attach_lora(spec)
                .with_context(|| format!("LoRA adapter {}", spec.path.display()))?;
            if !quiet {
                eprintln!(
                    "mica: LoRA {} (rank {}, {} projections, scale {})",
                    spec.path.display(),
                    a.rank,
                    a.targets.len(),
                    spec.scale
                );
            }
        }
        Ok(())
    }
}
