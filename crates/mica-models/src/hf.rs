//! Hugging Face model folders: `config.json` (typed, validated), `generation_config.json`,
//! `tokenizer.json` / `tokenizer_config.json`, and the safetensors checkpoint (one file or
//! shards behind `model.safetensors.index.json`).
//!
//! `config.json` is read once into [`HfConfig`] (every field the supported families use,
//! all optional at parse time); [`HfConfig::decoder_config`] resolves the fields every
//! decoder shares into a [`ModelConfig`], with an error naming any required field that is
//! missing or invalid. Family-specific fields are resolved by the architecture files.

use crate::config::{
    Activation, LongRope, ModelConfig, NormKind, Numerics, RopeConfig, yarn_factors, yarn_mscale,
};
use crate::error::{ModelError, Result};
use crate::names::NameTable;
use crate::weights::WeightLoader;
use mica_formats::CheckpointSet;
use mica_formats::checkpoint::files_with;
use mica_kernels::ops::RopeStyle;
use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The fields of `config.json` mica reads. Unknown fields are ignored.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct HfConfig {
    pub architectures: Option<Vec<String>>,
    pub model_type: Option<String>,
    pub vocab_size: Option<usize>,
    pub hidden_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub max_position_embeddings: Option<usize>,
    /// transformers < 5 (Phi-3 LongRoPE): the pre-training context.
    pub original_max_position_embeddings: Option<usize>,
    pub rms_norm_eps: Option<f64>,
    pub rope_theta: Option<f64>,
    /// transformers < 5: `{"rope_type" | "type": ..., "factor": ...}`.
    pub rope_scaling: Option<Value>,
    /// transformers ≥ 5: `{"rope_type", "rope_theta", ...}`, or one such object per layer
    /// type (`{"full_attention": {...}, "sliding_attention": {...}}`, Gemma 3).
    pub rope_parameters: Option<Value>,
    pub tie_word_embeddings: Option<bool>,
    pub sliding_window: Option<usize>,
    /// Qwen2 / Mistral: whether `sliding_window` is used at all.
    pub use_sliding_window: Option<bool>,
    /// Per layer: `"sliding_attention"` or `"full_attention"`.
    pub layer_types: Option<Vec<String>>,
    pub sliding_window_pattern: Option<usize>,
    /// SmolLM3: per layer, 1 where the layer applies RoPE and 0 where it does not (NoPE).
    pub no_rope_layers: Option<Vec<Value>>,
    /// SmolLM3: without `no_rope_layers`, every `no_rope_layer_interval`-th layer is NoPE.
    pub no_rope_layer_interval: Option<usize>,
    pub query_pre_attn_scalar: Option<f64>,
    pub attn_logit_softcapping: Option<f64>,
    pub final_logit_softcapping: Option<f64>,
    pub rope_local_base_freq: Option<f64>,
    pub hidden_act: Option<String>,
    /// transformers < 5 (Phi-3, NeoX): rotary fraction of each head.
    pub partial_rotary_factor: Option<f64>,
    pub hidden_activation: Option<String>,
    pub attention_bias: Option<bool>,
    /// Gemma 4: per-layer overrides (`{"<layer>": {"head_dim": .., "num_key_value_heads":
    /// ..}}`, what transformers writes for the global layers).
    pub per_layer_config: Option<Value>,
    /// Gemma 4: head size and key/value heads of the global layers (constructor arguments
    /// transformers folds into `per_layer_config`; read when a config states them).
    pub global_head_dim: Option<usize>,
    pub num_global_key_value_heads: Option<usize>,
    /// Gemma 4: global layers have no `v_proj`; their values are the keys.
    pub attention_k_eq_v: Option<bool>,
    /// Gemma 4: per-layer embedding width (0 or absent: none).
    pub hidden_size_per_layer_input: Option<usize>,
    /// Gemma 4: the last layers reuse earlier layers' keys and values.
    pub num_kv_shared_layers: Option<usize>,
    /// Gemma 4: mixture-of-experts feed-forward beside the dense one.
    pub enable_moe_block: Option<bool>,
    pub use_double_wide_mlp: Option<bool>,
    /// Mixture-of-experts (Qwen2-MoE / Qwen3-MoE): experts, experts per token, expert and
    /// shared-expert widths, renormalization, which layers are sparse.
    pub num_experts: Option<usize>,
    /// Mixtral's name for `num_experts`.
    pub num_local_experts: Option<usize>,
    pub num_experts_per_tok: Option<usize>,
    pub moe_intermediate_size: Option<usize>,
    pub shared_expert_intermediate_size: Option<usize>,
    pub norm_topk_prob: Option<bool>,
    pub decoder_sparse_step: Option<usize>,
    pub mlp_only_layers: Option<Vec<usize>>,
    /// DeepSeek-V2/V3 latent attention: the query's and the keys' / values' ranks, the
    /// per-head dimensions without and with RoPE, the value width.
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: Option<usize>,
    pub qk_nope_head_dim: Option<usize>,
    pub qk_rope_head_dim: Option<usize>,
    pub v_head_dim: Option<usize>,
    /// DeepSeek-V2/V3 experts: routed and shared counts, leading dense layers, expert
    /// groups (`n_group`, of which `topk_group` are searched), the routing method and
    /// scoring, the routed experts' output scale.
    pub n_routed_experts: Option<usize>,
    pub n_shared_experts: Option<usize>,
    pub first_k_dense_replace: Option<usize>,
    pub n_group: Option<usize>,
    pub topk_group: Option<usize>,
    pub topk_method: Option<String>,
    pub scoring_func: Option<String>,
    pub routed_scaling_factor: Option<f64>,
    pub bos_token_id: Option<Value>,
    pub eos_token_id: Option<Value>,
    /// GPT-2's names of shared fields (folded into the shared ones by [`HfConfig::resolve_aliases`]).
    pub n_embd: Option<usize>,
    pub n_layer: Option<usize>,
    pub n_head: Option<usize>,
    pub n_positions: Option<usize>,
    pub n_inner: Option<usize>,
    /// OPT's name of the feed-forward width.
    pub ffn_dim: Option<usize>,
    pub layer_norm_epsilon: Option<f64>,
    /// GPT-2: `gelu_new` (tanh approximation) and its synonyms.
    pub activation_function: Option<String>,
    pub scale_attn_weights: Option<bool>,
    pub scale_attn_by_inverse_layer_idx: Option<bool>,
    pub reorder_and_upcast_attn: Option<bool>,
    /// GPT-NeoX: LayerNorm epsilon, parallel residual, and (transformers < 5) the rotary
    /// fraction and base.
    pub layer_norm_eps: Option<f64>,
    pub use_parallel_residual: Option<bool>,
    pub rotary_pct: Option<f64>,
    pub rotary_emb_base: Option<f64>,
}

impl HfConfig {
    /// Folds family-specific names of shared fields into the shared ones: GPT-2's (and
    /// GPTBigCode's and CodeGen's) `n_embd`, `n_layer`, `n_head`, `n_positions`, `n_inner` (4 × `n_embd`
    /// when null), OPT's `ffn_dim`,
    /// `layer_norm_epsilon`; GPT-NeoX's `layer_norm_eps`, `rotary_pct`, `rotary_emb_base`.
    /// (The epsilon lands in `rms_norm_eps`, which then is the norm's epsilon whatever the norm.)
    fn resolve_aliases(&mut self) {
        let gpt2 = matches!(
            self.model_type.as_deref(),
            Some("gpt2" | "gpt_bigcode" | "codegen")
        );
        self.hidden_size = self.hidden_size.or(self.n_embd);
        self.num_hidden_layers = self.num_hidden_layers.or(self.n_layer);
        self.num_attention_heads = self.num_attention_heads.or(self.n_head);
        self.max_position_embeddings = self.max_position_embeddings.or(self.n_positions);
        self.intermediate_size = self.intermediate_size.or(self.n_inner).or(self.ffn_dim);
        if gpt2 && self.intermediate_size.is_none() {
            self.intermediate_size = self.hidden_size.map(|d| 4 * d);
        }
        self.rms_norm_eps = self
            .rms_norm_eps
            .or(self.layer_norm_epsilon)
            .or(self.layer_norm_eps);
        self.partial_rotary_factor = self.partial_rotary_factor.or(self.rotary_pct);
        self.rope_theta = self.rope_theta.or(self.rotary_emb_base);
        self.hidden_act = self.hidden_act.take().or(self.activation_function.clone());
    }
}

/// An open Hugging Face model folder.
pub struct HfFolder {
    pub dir: PathBuf,
    pub config: HfConfig,
    /// The raw `config.json` (for `mica inspect`).
    pub config_json: Value,
    /// `generation_config.json`, when present.
    pub generation: Option<Value>,
    pub weights: CheckpointSet,
}

/// Whether `dir` looks like a Hugging Face model folder: a `config.json` and weights beside
/// it (what [`HfFolder::open`] needs before it reads anything).
pub fn is_hf_folder(dir: &Path) -> bool {
    dir.join("config.json").is_file() && !weight_files(dir).is_empty()
}

/// The weight files directly in `dir` — `*.safetensors`, or else PyTorch's `*.bin`, `*.pt`,
/// `*.pth` (every shard of a checkpoint), sorted.
pub fn weight_files(dir: &Path) -> Vec<PathBuf> {
    let st = files_with(dir, &["safetensors"]);
    if st.is_empty() {
        files_with(dir, &["bin", "pt", "pth"])
    } else {
        st
    }
}

impl HfFolder {
    /// Reads `config.json` and opens the checkpoint.
    pub fn open(dir: impl AsRef<Path>) -> Result<HfFolder> {
        let dir = dir.as_ref().to_path_buf();
        let config_json = read_json(&dir.join("config.json"))?.ok_or_else(|| {
            config_err(
                &dir.join("config.json"),
                "config.json",
                "missing from the folder",
            )
        })?;
        let config_json = text_view(config_json);
        let mut config: HfConfig = serde_json::from_value(config_json.clone())
            .map_err(|e| config_err(&dir.join("config.json"), "config.json", e.to_string()))?;
        config.resolve_aliases();
        let generation = read_json(&dir.join("generation_config.json"))?;
        let weights = CheckpointSet::open_dir(&dir)?;
        Ok(HfFolder {
            dir,
            config,
            config_json,
            generation,
            weights,
        })
    }

    /// The path of `config.json` (errors about its fields name it).
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("config.json")
    }

    /// The first `architectures` entry: the registry key of the folder.
    pub fn architecture(&self) -> Result<&str> {
        self.config
            .architectures
            .as_ref()
            .and_then(|a| a.first())
            .map(String::as_str)
            .ok_or_else(|| {
                config_err(
                    &self.config_path(),
                    "architectures",
                    "missing: config.json does not say which architecture it holds",
                )
            })
    }

    /// The checkpoint's tensors, named through a family's table.
    pub fn weights(&self, arch: &str, names: &'static NameTable) -> WeightLoader {
        WeightLoader::safetensors(&self.weights, self.dir.clone(), arch, names)
    }

    /// An error about a `config.json` field.
    pub fn field_err(&self, field: &str, msg: impl Into<String>) -> ModelError {
        config_err(&self.config_path(), field, msg)
    }

    /// A required positive integer field.
    pub fn required(&self, field: &str, v: Option<usize>) -> Result<usize> {
        match v {
            None => Err(self.field_err(field, "missing (required by this architecture)")),
            Some(0) => Err(self.field_err(field, "must be positive, got 0")),
            Some(x) => Ok(x),
        }
    }

    /// The hyper-parameters every decoder shares, resolved and validated. `style` is how
    /// the family's checkpoints rotate (transformers rotates halves: NeoX style).
    pub fn decoder_config(&self, arch: &str, n_vocab_embd: usize) -> Result<ModelConfig> {
        let c = &self.config;
        let n_embd = self.required("hidden_size", c.hidden_size)?;
        let n_layer = self.required("num_hidden_layers", c.num_hidden_layers)?;
        let n_head = self.required("num_attention_heads", c.num_attention_heads)?;
        let n_head_kv = c.num_key_value_heads.unwrap_or(n_head);
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(self.field_err(
                "num_key_value_heads",
                format!("{n_head_kv} does not divide the {n_head} query heads"),
            ));
        }
        let head_dim = match c.head_dim {
            Some(d) if d > 0 => d,
            Some(_) => return Err(self.field_err("head_dim", "must be positive")),
            None if n_embd % n_head == 0 => n_embd / n_head,
            None => {
                return Err(self.field_err(
                    "num_attention_heads",
                    format!("{n_head} heads do not divide hidden_size {n_embd}"),
                ));
            }
        };
        // A model whose every layer is a mixture of experts may give only the experts'
        // width (Qwen3.5-MoE).
        let n_ff = match (c.intermediate_size, c.moe_intermediate_size) {
            (None, Some(f)) => f,
            (n, _) => self.required("intermediate_size", n)?,
        };
        let n_vocab = self.required("vocab_size", c.vocab_size)?;
        if n_vocab != n_vocab_embd {
            return Err(self.field_err(
                "vocab_size",
                format!("{n_vocab} differs from the token embedding's {n_vocab_embd} rows"),
            ));
        }
        let norm_eps = c.rms_norm_eps.unwrap_or(1e-6) as f32;
        let params = self.rope_params("full_attention");
        let rope = self.rope(params.clone(), head_dim)?;
        let long_rope = self.long_rope(&params, rope.n_dims)?;
        Ok(ModelConfig {
            arch: arch.to_string(),
            name: self
                .dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned()),
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            layer_head_dim: vec![head_dim; n_layer],
            layer_n_head_kv: vec![n_head_kv; n_layer],
            layer_kv_from: vec![None; n_layer],
            n_ff,
            layer_n_ff: vec![n_ff; n_layer],
            n_ctx_train: c.max_position_embeddings.unwrap_or(2048),
            norm_eps,
            rope,
            rope_local: None,
            long_rope,
            layer_window: vec![None; n_layer],
            layer_rope: vec![true; n_layer],
            embd_scale: None,
            q_scale: None,
            attn_softcap: None,
            final_softcap: None,
            act: Activation::Silu,
            norm: NormKind::Rms,
            parallel_residual: false,
            post_norm: false,
            final_norm: true,
            numerics: Numerics::LlamaCpp,
            kv_override: None,
            delta_net: None,
            mla: None,
        })
    }

    /// `[n_layer]` each layer's sliding window: per `layer_types` when config.json lists
    /// them; otherwise, when `on`, every layer but every `pattern`-th.
    pub fn layer_windows(
        &self,
        n_layer: usize,
        on: bool,
        pattern: Option<usize>,
    ) -> Result<Vec<Option<usize>>> {
        let c = &self.config;
        let Some(win) = c.sliding_window.filter(|&w| w > 0) else {
            return Ok(vec![None; n_layer]);
        };
        if let Some(types) = &c.layer_types {
            if types.len() != n_layer {
                return Err(self.field_err(
                    "layer_types",
                    format!("{} entries for {n_layer} layers", types.len()),
                ));
            }
            return types
                .iter()
                .map(|t| match t.as_str() {
                    "sliding_attention" => Ok(Some(win)),
                    "full_attention" => Ok(None),
                    other => Err(self.field_err(
                        "layer_types",
                        format!("unknown layer type '{other}' (sliding_attention, full_attention)"),
                    )),
                })
                .collect();
        }
        if !on {
            return Ok(vec![None; n_layer]);
        }
        Ok((0..n_layer)
            .map(|il| match pattern {
                Some(n) if n > 0 && il % n == n - 1 => None,
                _ => Some(win),
            })
            .collect())
    }

    /// The RoPE parameter object for a layer type: transformers 5's `rope_parameters`
    /// (per layer type or shared), else the older `rope_theta` + `rope_scaling`.
    pub fn rope_params(&self, layer_type: &str) -> Value {
        let c = &self.config;
        if let Some(p) = &c.rope_parameters {
            if let Some(per_type) = p.get(layer_type).filter(|v| v.is_object()) {
                return per_type.clone();
            }
            if p.get("rope_theta").is_some() || p.get("rope_type").is_some() {
                return p.clone();
            }
        }
        let mut v = c.rope_scaling.clone().unwrap_or(Value::Null);
        if !v.is_object() {
            v = serde_json::json!({});
        }
        if let Some(t) = c.rope_theta {
            v["rope_theta"] = t.into();
        }
        if let Some(f) = c.partial_rotary_factor {
            v["partial_rotary_factor"] = f.into();
        }
        v
    }

    /// Resolves one RoPE parameter object (default / linear / llama3 scaling).
    pub fn rope(&self, p: Value, head_dim: usize) -> Result<RopeConfig> {
        let freq_base = p["rope_theta"].as_f64().unwrap_or(10000.0) as f32;
        let kind = p["rope_type"]
            .as_str()
            .or(p["type"].as_str())
            .unwrap_or("default");
        let factor = p["factor"].as_f64();
        // Partial rotary (Phi-3, NeoX): the first `factor × head_dim` dimensions rotate.
        // (Proportional RoPE rotates the whole head, the rest at frequency 0: below.)
        let partial = p["partial_rotary_factor"].as_f64().unwrap_or(1.0);
        let n_dims = match kind {
            "proportional" => head_dim & !1,
            _ => ((head_dim as f64 * partial) as usize) & !1,
        };
        if n_dims == 0 || n_dims > head_dim {
            return Err(self.field_err(
                "partial_rotary_factor",
                format!("{partial} leaves no valid rotary width for head_dim {head_dim}"),
            ));
        }
        let mut rope = RopeConfig {
            style: RopeStyle::Neox,
            n_dims,
            freq_base,
            freq_scale: 1.0,
            freq_factors: None,
            attn_factor: 1.0,
        };
        match kind {
            "default" => {}
            // transformers' `_compute_yarn_parameters` without `mscale` / `mscale_all_dim`
            // (DeepSeek's, refused below).
            "yarn" => {
                let f = match factor {
                    Some(f) if f > 0.0 => f as f32,
                    _ => {
                        return Err(self
                            .field_err("rope_parameters.factor", "YaRN needs a positive factor"));
                    }
                };
                if p.get("mscale").is_some() || p.get("mscale_all_dim").is_some() {
                    return Err(self.field_err(
                        "rope_parameters.mscale",
                        "YaRN with mscale / mscale_all_dim is not supported yet",
                    ));
                }
                let orig = p["original_max_position_embeddings"]
                    .as_u64()
                    .or(self
                        .config
                        .original_max_position_embeddings
                        .map(|v| v as u64))
                    .ok_or_else(|| {
                        self.field_err(
                            "rope_parameters.original_max_position_embeddings",
                            "missing (required by YaRN)",
                        )
                    })? as usize;
                let beta = |k: &str, d: f64| p[k].as_f64().unwrap_or(d) as f32;
                let betas = (beta("beta_fast", 32.0), beta("beta_slow", 1.0));
                let truncate = p["truncate"].as_bool().unwrap_or(true);
                rope.freq_factors = Some(yarn_factors(n_dims, freq_base, f, orig, betas, truncate));
                rope.attn_factor = match p["attention_factor"].as_f64() {
                    Some(a) => a as f32,
                    None => yarn_mscale(f),
                };
            }
            "linear" => match factor {
                Some(f) if f > 0.0 => rope.freq_scale = 1.0 / f as f32,
                _ => {
                    return Err(self.field_err(
                        "rope_scaling.factor",
                        "linear RoPE scaling needs a positive factor",
                    ));
                }
            },
            "llama3" => rope.freq_factors = Some(llama3_factors(&p, n_dims, freq_base)),
            // Gemma 4's global layers: the first `partial × head_dim / 2` pairs rotate at
            // `base^(-2i / head_dim)`, the others not at all (inverse frequency 0), written
            // as llama.cpp's converter does, frequency divisors of 1 and 1e30.
            "proportional" => {
                let pairs = head_dim / 2;
                let rotated = ((partial * head_dim as f64 / 2.0).floor() as usize).min(pairs);
                let mut f = vec![1.0f32; rotated];
                f.resize(pairs, 1e30);
                rope.freq_factors = Some(f);
                if let Some(x) = factor {
                    if x <= 0.0 {
                        return Err(self.field_err(
                            "rope_parameters.factor",
                            "proportional RoPE needs a positive factor",
                        ));
                    }
                    rope.freq_scale = 1.0 / x as f32;
                }
            }
            // The factors depend on the context: [`HfFolder::long_rope`].
            "longrope" | "su" => {}
            other => {
                return Err(self.field_err(
                    "rope_scaling.rope_type",
                    format!(
                        "RoPE scaling '{other}' is not supported yet (default, linear, llama3, longrope, proportional, yarn are)"
                    ),
                ));
            }
        }
        Ok(rope)
    }
}

impl HfFolder {
    /// LongRoPE ("longrope", or "su" in older Phi-3 configs) from a RoPE parameter object:
    /// `short_factor` and `long_factor` (`n_dims / 2` each), `original_max_position_embeddings`
    /// (in the object or at the top of config.json), and the cos/sin factor as transformers
    /// computes it: `attention_factor` if given, else `sqrt(1 + ln f / ln original)` with
    /// `f` = `factor`, or `max_position_embeddings / original` (1 when `f ≤ 1`).
    pub fn long_rope(&self, p: &Value, n_dims: usize) -> Result<Option<LongRope>> {
        let kind = p["rope_type"].as_str().or(p["type"].as_str());
        if !matches!(kind, Some("longrope" | "su")) {
            return Ok(None);
        }
        let factors = |key: &str| -> Result<Vec<f32>> {
            let field = format!("rope_scaling.{key}");
            let v = p[key]
                .as_array()
                .ok_or_else(|| self.field_err(&field, "missing (LongRoPE needs it)"))?;
            let f: Vec<f32> = v
                .iter()
                .map(|x| x.as_f64().filter(|f| f.is_finite() && *f > 0.0))
                .collect::<Option<Vec<f64>>>()
                .ok_or_else(|| self.field_err(&field, "must be a list of positive numbers"))?
                .into_iter()
                .map(|x| x as f32)
                .collect();
            if f.len() != n_dims / 2 {
                return Err(self.field_err(
                    &field,
                    format!(
                        "{} entries, expected {} (half the rotary width)",
                        f.len(),
                        n_dims / 2
                    ),
                ));
            }
            Ok(f)
        };
        let (short, long) = (factors("short_factor")?, factors("long_factor")?);
        let orig = p["original_max_position_embeddings"]
            .as_u64()
            .map(|v| v as usize)
            .or(self.config.original_max_position_embeddings)
            .filter(|&v| v > 1)
            .ok_or_else(|| {
                self.field_err(
                    "original_max_position_embeddings",
                    "missing or < 2 (LongRoPE needs the pre-training context)",
                )
            })?;
        let factor = p["factor"].as_f64().unwrap_or_else(|| {
            self.config.max_position_embeddings.unwrap_or(orig) as f64 / orig as f64
        });
        let attn_factor = match p["attention_factor"].as_f64() {
            Some(a) => a,
            None if factor <= 1.0 => 1.0,
            None => (1.0 + factor.ln() / (orig as f64).ln()).sqrt(),
        };
        Ok(Some(LongRope {
            short,
            long,
            original_ctx: orig,
            attn_factor: attn_factor as f32,
        }))
    }
}

/// Llama 3.1's frequency divisors (`rope_freqs.weight` in GGUF), as llama.cpp's converter
/// computes them from `factor`, `low_freq_factor`, `high_freq_factor` and
/// `original_max_position_embeddings`.
fn llama3_factors(p: &Value, n_dims: usize, base: f32) -> Vec<f32> {
    let f = |k: &str, d: f64| p[k].as_f64().unwrap_or(d);
    let (factor, low, high) = (
        f("factor", 8.0),
        f("low_freq_factor", 1.0),
        f("high_freq_factor", 4.0),
    );
    let old_ctx = f("original_max_position_embeddings", 8192.0);
    let (low_wl, high_wl) = (old_ctx / low, old_ctx / high);
    (0..n_dims / 2)
        .map(|i| {
            let freq = 1.0 / (base as f64).powf(2.0 * i as f64 / n_dims as f64);
            let wl = 2.0 * std::f64::consts::PI / freq;
            let r = if wl < high_wl {
                1.0
            } else if wl > low_wl {
                factor
            } else {
                let smooth = (old_ctx / wl - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            r as f32
        })
        .collect()
}

fn config_err(path: &Path, key: &str, msg: impl Into<String>) -> ModelError {
    ModelError::Config {
        path: path.to_path_buf(),
        key: key.to_string(),
        msg: msg.into(),
    }
}

/// A multimodal wrapper's `config.json` (`architectures[0]` ending in
/// `ForConditionalGeneration`, the text model's fields under `text_config`, e.g.
/// `Gemma4ForConditionalGeneration`) seen as its text model: `text_config`'s fields, then
/// the top-level ones it lacks (`architectures`, `tie_word_embeddings`...) except the other
/// towers' configs. Any other config as it is.
fn text_view(json: Value) -> Value {
    let wrapper = json["architectures"][0]
        .as_str()
        .is_some_and(|a| a.ends_with("ForConditionalGeneration"));
    let (true, Some(text), Some(top)) =
        (wrapper, json["text_config"].as_object(), json.as_object())
    else {
        return json;
    };
    let mut merged = text.clone();
    for (k, v) in top {
        if !k.ends_with("_config") && !merged.contains_key(k) {
            merged.insert(k.clone(), v.clone());
        }
    }
    merged.insert("architectures".into(), json["architectures"].clone());
    Value::Object(merged)
}

/// A JSON file, or `None` when it does not exist.
pub fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|cause| {
        ModelError::Format(mica_formats::FormatError::Io {
            path: path.to_path_buf(),
            cause,
        })
    })?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| config_err(path, "(file)", format!("not valid JSON: {e}")))
}
