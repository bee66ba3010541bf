//! The sampling flags shared by `mica run` and `mica chat`, so both accept the same names,
//! defaults (llama.cpp's) and penalties.

use clap::Args;
use mica::engine::SamplingParams;

#[derive(Args, Debug, Clone, PartialEq)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    /// Keep the K most likely tokens; 0 disables.
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P; 1 disables.
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one; 0 disables.
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalize recently seen tokens (divide positive logits by it); 1 disables.
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Subtracted once from every recently seen token's logit; 0 disables.
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtracted per occurrence from recently seen tokens' logits; 0 disables.
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (default: a new random one; for chat, one per answer). The same seed
    /// reproduces a run.
    #[arg(short = 's', long = "seed")]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The sampler's parameters; `seed` is used when no seed was fixed.
    pub fn params(&self, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.repeat_last_n,
            seed: self.seed.unwrap_or(seed),
        }
    }
}
