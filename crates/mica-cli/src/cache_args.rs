//! `--cache-type-k` / `--cache-type-v` of `run`, `chat`, `serve`, `bench` and `perplexity`:
//! the KV cache's key and value types, with llama.cpp's names (`-ctk`/`-ctv`) and block
//! formats (see `mica_models::kv_cache::KvType`).

use anyhow::{Context, Result};
use clap::Args;
use mica::models::LoadedModel;
use mica::models::kv_cache::KvType;

#[derive(Args, Debug, Clone, Default)]
pub struct CacheArgs {
    /// KV cache type of the keys: f16 (default), f32, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0,
    /// q5_1 (llama.cpp's names and block formats; q8_0 halves the cache, q4_0 takes a
    /// quarter plus scales).
    #[arg(long = "cache-type-k", value_name = "TYPE",
          value_parser = parse_kv_type)]
    pub cache_type_k: Option<KvType>,
    /// KV cache type of the values (same types as --cache-type-k).
    #[arg(long = "cache-type-v", value_name = "TYPE",
          value_parser = parse_kv_type)]
    pub cache_type_v: Option<KvType>,
}

fn parse_kv_type(s: &str) -> Result<KvType, String> {
    KvType::from_name(s).map_err(|e| e.to_string())
}

impl CacheArgs {
    /// Sets the cache types of `lm` (nothing when neither flag was given).
    pub fn apply(&self, lm: &mut LoadedModel) -> Result<()> {
        lm.model
            .config
            .choose_cache_types(self.cache_type_k, self.cache_type_v)
            .context("--cache-type-k/--cache-type-v")
    }
}
