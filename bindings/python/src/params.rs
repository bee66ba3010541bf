//! Keyword arguments of the generation methods into the engine's [`GenerateParams`]. The
//! defaults are llama.cpp's sampling chain (`SamplingParams::default()`), as `mica run`
//! uses them; `seed=None` draws a fresh seed.

use mica::{GenerateParams, SamplingParams};

/// Everything a generation call can set, as the Python methods name it.
#[derive(Clone, Debug)]
pub struct Sampling {
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub penalty_last_n: usize,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub logit_bias: Vec<(u32, f32)>,
    pub typical_p: f32,
    pub xtc_probability: f32,
    pub xtc_threshold: f32,
    pub dry_multiplier: f32,
    pub dry_base: f32,
    pub dry_allowed_length: u32,
    pub dry_penalty_last_n: i32,
    pub dry_sequence_breakers: Vec<String>,
}

impl Sampling {
    pub fn into_params(self) -> GenerateParams {
        GenerateParams {
            max_tokens: self.max_tokens,
            sampling: SamplingParams {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repeat_penalty: self.repeat_penalty,
                presence_penalty: self.presence_penalty,
                frequency_penalty: self.frequency_penalty,
                penalty_last_n: self.penalty_last_n,
                seed: self.seed.unwrap_or_else(mica::engine::random_seed),
                mirostat: None,
                typical_p: self.typical_p,
                xtc_probability: self.xtc_probability,
                xtc_threshold: self.xtc_threshold,
                dry_multiplier: self.dry_multiplier,
                dry_base: self.dry_base,
                dry_allowed_length: self.dry_allowed_length,
                dry_penalty_last_n: self.dry_penalty_last_n,
                dry_sequence_breakers: self.dry_sequence_breakers,
            },
            stop: self.stop,
            ignore_eos: self.ignore_eos,
            logit_bias: self.logit_bias,
        }
    }
}
