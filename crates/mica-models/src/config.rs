//! The resolved, validated hyper-parameters of a decoder-only transformer.
//!
//! Raw metadata (GGUF `{arch}.*` keys today, `config.json` later) is read once into a
//! [`ModelConfig`] with derived sizes; nothing downstream re-reads metadata. Which features a
//! family uses (RoPE layout, biases, tied output) is decided by its architecture file.

use crate::error::{ModelError, Result};
use crate::kv_cache::{CacheTypes, KvType};
use mica_formats::{GgufFile, MetaArray, MetaValue};
use mica_kernels::ops::RopeStyle;

/// Rotary position embedding parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    pub style: RopeStyle,
    /// Rotated dimensions per head (≤ head_dim; fewer means partial rotary).
    pub n_dims: usize,
    pub freq_base: f32,
    /// 1 / linear scaling factor (1.0 when unscaled).
    pub freq_scale: f32,
    /// Per-pair frequency divisors (`rope_freqs.weight`, how GGUF encodes Llama-3 scaling;
    /// YaRN's blend of interpolated and extrapolated frequencies, [`yarn_factors`]).
    pub freq_factors: Option<Vec<f32>>,
    /// Multiplies cos and sin (YaRN's `attention_factor`; 1 otherwise).
    pub attn_factor: f32,
}

/// YaRN's per-pair frequency divisors ("YaRN: Efficient Context Window Extension of Large
/// Language Models", Peng et al. 2023): pair `i` rotates at `base^(-2i/n_dims) · (r_i +
/// (1 - r_i) / factor)`, `r_i` ramping from 1 (extrapolated, high frequencies) below the
/// correction dimension of `beta_fast` rotations over `orig_ctx` positions to 0
/// (interpolated) above that of `beta_slow`. `truncate` rounds the correction range outwards
/// (llama.cpp always does; transformers unless `truncate: false`).
pub fn yarn_factors(
    n_dims: usize,
    base: f32,
    factor: f32,
    orig_ctx: usize,
    (beta_fast, beta_slow): (f32, f32),
    truncate: bool,
) -> Vec<f32> {
    let corr = |rot: f32| {
        let two_pi = 2.0 * std::f32::consts::PI;
        n_dims as f32 * (orig_ctx as f32 / (rot * two_pi)).ln() / (2.0 * base.ln())
    };
    let (mut low, mut high) = (corr(beta_fast), corr(beta_slow));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0), high.min(n_dims as f32 - 1.0));
    if high == low {
        high += 0.001;
    }
    (0..n_dims / 2)
        .map(|i| {
            let r = 1.0 - ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
            1.0 / (r + (1.0 - r) / factor)
        })
        .collect()
}

/// YaRN's default cos/sin factor, `1 + 0.1 ln(factor)` (1 for factors up to 1).
pub fn yarn_mscale(factor: f32) -> f32 {
    if factor <= 1.0 {
        1.0
    } else {
        1.0 + 0.1 * factor.ln()
    }
}

/// Phi-3's LongRoPE ("su") scaling: per-pair frequency divisors for short and long
/// contexts, and a factor on the rotated dimensions of queries and keys (on cos and sin).
///
/// transformers switches to the long factors when a forward's sequence (its largest
/// position plus one) exceeds `original_ctx`, so a cached prefix keeps the short rotation
/// while later tokens get the long one. mica decides once per cache, as llama.cpp does
/// (`n_ctx_seq > n_ctx_orig_yarn`): the long factors when the cache holds more than
/// `original_ctx` tokens per sequence, the short ones otherwise. Every key of a sequence is
/// then rotated alike, and the result does not depend on how a prompt is split into
/// batches. This equals transformers' full-sequence forward whenever the cache size and the
/// sequence are on the same side of `original_ctx`.
#[derive(Clone, Debug, PartialEq)]
pub struct LongRope {
    /// `[n_dims / 2]`
    pub short: Vec<f32>,
    /// `[n_dims / 2]`
    pub long: Vec<f32>,
    /// The context length the short factors were trained for.
    pub original_ctx: usize,
    /// Multiplies cos and sin (transformers' `attention_scaling`).
    pub attn_factor: f32,
}

impl LongRope {
    /// The factors and cos/sin scale for a cache of `n_ctx` tokens per sequence.
    pub fn for_ctx(&self, n_ctx: usize) -> (&[f32], f32) {
        let f = if n_ctx > self.original_ctx {
            &self.long
        } else {
            &self.short
        };
        (f, self.attn_factor)
    }
}

/// The activation of the feed-forward block: gated, `down(act(gate(x)) * up(x))`, or plain,
/// `down(act(up(x)))` (which one is the layer's [`crate::model::Ffn`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SiLU; gated: SwiGLU (LLaMA, Qwen, Mistral).
    Silu,
    /// GELU, tanh approximation (Gemma's GeGLU, GPT-2's `gelu_new`).
    GeluTanh,
    /// GELU with `erf` (transformers' `gelu`: GPT-NeoX / Pythia). llama.cpp computes it with
    /// the tanh approximation; so does mica under [`Numerics::LlamaCpp`].
    GeluErf,
    /// `max(x, 0)` (OPT).
    Relu,
    /// gpt-oss's clamped SwiGLU, gated only: `(clamp(up, ±7) + 1) · g · sigmoid(1.702 g)`
    /// with `g = min(gate, 7)` (llama.cpp's `swiglu_oai`).
    SwigluOai,
}

/// The normalization before each sub-block and before the output head.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NormKind {
    /// RMSNorm with a weight (LLaMA and most families since).
    #[default]
    Rms,
    /// LayerNorm with a weight and a bias (GPT-2, GPT-NeoX).
    Layer,
}

/// Which reference the arithmetic between the matrix products follows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Numerics {
    /// llama.cpp's CPU rounding: f16 KV cache, f16 query and accumulator in decode
    /// attention, GELU through an f16 table. Keeps quantized models on llama.cpp's tokens.
    #[default]
    LlamaCpp,
    /// float32 throughout: f32 KV cache, f32 attention, GELU by its formula. What
    /// transformers computes for a float32 checkpoint (chosen when every weight matrix is F32).
    F32,
}

impl Numerics {
    /// The KV cache element type these numerics use.
    pub fn kv_type(self) -> KvType {
        match self {
            Numerics::LlamaCpp => KvType::F16,
            Numerics::F32 => KvType::F32,
        }
    }
}

/// The Gated DeltaNet (linear attention) layers of a hybrid model (Qwen3.5): their shape,
/// and which layers they are. Each such layer keeps, per sequence, the last
/// `conv_kernel - 1` inputs of its causal convolution and one `head_k_dim × head_v_dim`
/// state matrix per value head, in f32 ([`crate::KvCache`] holds them beside the paged KV).
#[derive(Clone, Debug, PartialEq)]
pub struct DeltaNetConfig {
    /// `[n_layer]` whether each layer is a DeltaNet layer (the others attend).
    pub layers: Vec<bool>,
    /// Width of the causal convolution over time (including the current token).
    pub conv_kernel: usize,
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub head_k_dim: usize,
    pub head_v_dim: usize,
    /// Which key head a value head reads when there are more value heads than key heads:
    /// `true`, head `h` reads key head `h % n_k_heads` (llama.cpp's converter reorders the
    /// value heads so, GGUF); `false`, head `h / (n_v_heads / n_k_heads)` (checkpoints).
    pub v_tiled: bool,
    /// Epsilon of the L2 normalization of queries and keys.
    pub l2_eps: f32,
}

impl DeltaNetConfig {
    /// Width of the queries (and of the keys): `n_k_heads · head_k_dim`.
    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.head_k_dim
    }

    /// Width of the values and of the layer's output before its projection.
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.head_v_dim
    }

    /// Channels of the convolution: q | k | v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// f32 values of one layer's convolution state: `[conv_kernel - 1][conv_dim]`.
    pub fn conv_state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
    }

    /// f32 values of one layer's recurrent state: `[n_v_heads][head_v_dim][head_k_dim]` (each
    /// head's matrix stored transposed, as ggml stores it).
    pub fn ssm_state_len(&self) -> usize {
        self.n_v_heads * self.head_k_dim * self.head_v_dim
    }

    /// The key head value head `h` reads.
    pub fn k_head_of(&self, h: usize) -> usize {
        if self.v_tiled {
            h % self.n_k_heads
        } else {
            h / (self.n_v_heads / self.n_k_heads)
        }
    }
}

/// Hyper-parameters of the model, validated.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// The family as the file names it (`general.architecture`).
    pub arch: String,
    pub name: Option<String>,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    /// Key/value heads of a layer not listed otherwise in `layer_n_head_kv`.
    pub n_head_kv: usize,
    /// Head size of a layer not listed otherwise in `layer_head_dim`.
    pub head_dim: usize,
    /// `[n_layer]` each layer's head size (Gemma 4's global layers have wider heads than
    /// its sliding-window ones); every entry is `head_dim` in most families.
    pub layer_head_dim: Vec<usize>,
    /// `[n_layer]` each layer's key/value heads (Gemma 4: fewer on global layers).
    pub layer_n_head_kv: Vec<usize>,
    /// `[n_layer]` per layer, `Some(j)`: the layer computes no keys or values and attends
    /// over layer `j`'s (an earlier layer of the same shape and window; Gemma 4's
    /// `num_kv_shared_layers`). `None` everywhere in most families.
    pub layer_kv_from: Vec<Option<usize>>,
    /// Feed-forward width of a layer not listed otherwise in `layer_n_ff`.
    pub n_ff: usize,
    /// `[n_layer]` each layer's feed-forward width (Gemma 4's double-wide MLP in the layers
    /// that share keys and values).
    pub layer_n_ff: Vec<usize>,
    /// Context length the model was trained with.
    pub n_ctx_train: usize,
    pub norm_eps: f32,
    /// RoPE of global-attention layers (of every layer when `rope_local` is `None`).
    pub rope: RopeConfig,
    /// RoPE of sliding-window layers when it differs (Gemma 3: base 10 000 locally).
    pub rope_local: Option<RopeConfig>,
    /// LongRoPE scaling (Phi-3 128k); replaces `rope.freq_factors` when set.
    pub long_rope: Option<LongRope>,
    /// `[n_layer]` the sliding window of each layer (`None`: global attention).
    pub layer_window: Vec<Option<usize>>,
    /// `[n_layer]` whether each layer rotates its queries and keys (SmolLM3's NoPE layers
    /// do not: their attention sees no position but the causal mask).
    pub layer_rope: Vec<bool>,
    /// Multiplies the token embeddings (Gemma: `sqrt(n_embd)`).
    pub embd_scale: Option<f32>,
    /// Multiplies the queries after RoPE, before attention, which then scales by 1 (how
    /// llama.cpp applies Gemma's `query_pre_attn_scalar`). `None`: attention scales the
    /// scores by `1/sqrt(head_dim)`.
    pub q_scale: Option<f32>,
    /// Attention logit soft-capping (`cap · tanh(s / cap)`).
    pub attn_softcap: Option<f32>,
    /// Final logit soft-capping.
    pub final_softcap: Option<f32>,
    pub act: Activation,
    pub norm: NormKind,
    /// GPT-NeoX's parallel residual: `x + attn(norm1(x)) + ffn(norm2(x))`, both sub-blocks
    /// reading the same input (otherwise the feed-forward block reads `x + attn(...)`).
    pub parallel_residual: bool,
    /// Each sub-block's norm follows its residual add, `x = norm(x + f(x))`, instead of
    /// preceding the sub-block (OPT-350m's `do_layer_norm_before: false`).
    pub post_norm: bool,
    /// A final norm before the output head (`output_norm`); false for OPT's post-norm and
    /// `_remove_final_layer_norm` models.
    pub final_norm: bool,
    /// Rounding of the KV cache, attention and activations ([`crate::arch`] picks F32 for
    /// float32 checkpoints; callers may override it before making a cache).
    pub numerics: Numerics,
    /// The Gated DeltaNet layers of a hybrid model (Qwen3.5); `None` in attention-only
    /// models.
    pub delta_net: Option<DeltaNetConfig>,
    /// The KV cache's key and value types when chosen by the user
    /// ([`ModelConfig::set_cache_types`]); `None`: the numerics' type for both.
    pub kv_override: Option<CacheTypes>,
    /// Multi-head latent attention (DeepSeek-V2/V3): every layer caches one latent row per
    /// token instead of per-head keys and values; `None` in other families.
    pub mla: Option<MlaConfig>,
}

/// The shape of multi-head latent attention (DeepSeek-V2's MLA). Each token's latent row is
/// `kv_lora_rank` compressed values (normed) followed by the `qk_rope` dimensions of its
/// rotated key, shared by every head. The cache stores that row split across its key and
/// value pools ([`MlaConfig::half`] values in each; `n_head_kv` 1 and `head_dim` the half in
/// [`ModelConfig`]), so the pool holds the latent and nothing else.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaConfig {
    /// Rank of the query's own low-rank projection (`q_a` → norm → `q_b`); `None`: one
    /// query projection.
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    /// Per-head query/key dimensions without RoPE and with it (the rope part of the key is
    /// shared by all heads).
    pub qk_nope: usize,
    pub qk_rope: usize,
    /// Per-head value width.
    pub v_head_dim: usize,
    /// Multiplies q·k (`1/sqrt(qk_nope + qk_rope)`, times YaRN's `mscale²`).
    pub kq_scale: f32,
    /// Multiplies the RoPE cos/sin (YaRN's attention factor; 1 without scaling).
    pub rope_mscale: f32,
}

impl MlaConfig {
    /// Width of a cached latent row: `kv_lora_rank + qk_rope`.
    pub fn latent_dim(&self) -> usize {
        self.kv_lora_rank + self.qk_rope
    }

    /// Values of a latent row in each of the key and value pools (the last one is padding
    /// when the row is odd).
    pub fn half(&self) -> usize {
        self.latent_dim().div_ceil(2)
    }

    /// Per-head query (and full key) width: `qk_nope + qk_rope`.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope + self.qk_rope
    }

    /// What a cache of full keys and values (`n_head` heads of `qk_nope + qk_rope` keys and
    /// `v_head_dim` values) would hold per token and layer, in values.
    pub fn full_kv_values(&self, n_head: usize) -> usize {
        n_head * (self.qk_head_dim() + self.v_head_dim)
    }
}

impl ModelConfig {
    /// Query width: `n_head * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Key/value width: `n_head_kv * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Head size of layer `l`.
    pub fn head_dim_of(&self, l: usize) -> usize {
        self.layer_head_dim[l]
    }

    /// Key/value heads of layer `l`.
    pub fn n_head_kv_of(&self, l: usize) -> usize {
        self.layer_n_head_kv[l]
    }

    /// Query width of layer `l`: `n_head * head_dim_of(l)`.
    pub fn q_dim_of(&self, l: usize) -> usize {
        self.n_head * self.layer_head_dim[l]
    }

    /// Feed-forward width of layer `l`.
    pub fn n_ff_of(&self, l: usize) -> usize {
        self.layer_n_ff[l]
    }

    /// Key/value width of layer `l`: `n_head_kv_of(l) * head_dim_of(l)`.
    pub fn kv_dim_of(&self, l: usize) -> usize {
        self.layer_n_head_kv[l] * self.layer_head_dim[l]
    }

    /// The widest query of any layer (what the forward pass's buffers hold).
    pub fn max_q_dim(&self) -> usize {
        (0..self.n_layer)
            .map(|l| self.q_dim_of(l))
            .max()
            .unwrap_or(0)
    }

    /// The widest key/value row of any layer.
    pub fn max_kv_dim(&self) -> usize {
        (0..self.n_layer)
            .map(|l| self.kv_dim_of(l))
            .max()
            .unwrap_or(0)
    }

    /// Keeps the first `n` layers' entries of every per-layer setting (`n` ≤ `n_layer`).
    pub fn keep_layers(&mut self, n: usize) {
        self.n_layer = n;
        self.layer_window.truncate(n);
        self.layer_rope.truncate(n);
        self.layer_head_dim.truncate(n);
        self.layer_n_head_kv.truncate(n);
        self.layer_n_ff.truncate(n);
        self.layer_kv_from.truncate(n);
        if let Some(d) = &mut self.delta_net {
            d.layers.truncate(n);
        }
    }

    /// Whether layer `l` is a Gated DeltaNet layer (keeps a recurrent state, no keys or
    /// values).
    pub fn is_recurrent(&self, l: usize) -> bool {
        self.delta_net.as_ref().is_some_and(|d| d.layers[l])
    }

    /// The types caches of this model store keys and values in: the user's choice, else
    /// the numerics' (f16, or f32 for float32 checkpoints).
    pub fn cache_types(&self) -> CacheTypes {
        self.kv_override
            .unwrap_or_else(|| CacheTypes::both(self.numerics.kv_type()))
    }

    /// Chooses the KV cache's types (llama.cpp's `--cache-type-k/-v`), for the caches made
    /// from now on; an error when a type's blocks do not divide the head size.
    pub fn set_cache_types(&mut self, t: CacheTypes) -> Result<()> {
        t.check(self)?;
        self.kv_override = Some(t);
        Ok(())
    }

    /// [`ModelConfig::set_cache_types`] for the sides a user named (`-ctk`/`-ctv`), each
    /// other side keeping its current type; nothing when neither is named.
    pub fn choose_cache_types(&mut self, k: Option<KvType>, v: Option<KvType>) -> Result<()> {
        if k.is_none() && v.is_none() {
            return Ok(());
        }
        let own = self.cache_types();
        self.set_cache_types(CacheTypes {
            k: k.unwrap_or(own.k),
            v: v.unwrap_or(own.v),
        })
    }

    /// Whether the model carries per-sequence recurrent state (a hybrid model): its cache
    /// cannot be truncated to an earlier position, only cleared.
    pub fn has_recurrent_state(&self) -> bool {
        self.delta_net
            .as_ref()
            .is_some_and(|d| d.layers.contains(&true))
    }

    /// Whether layers rotate queries and keys (GPT-2 adds learned positions instead).
    pub fn has_rope(&self) -> bool {
        self.rope.n_dims > 0
    }

    /// The RoPE parameters of layer `l`; `None` when the layer does not rotate (the model
    /// has no RoPE, or the layer is one of its NoPE layers).
    pub fn rope_of(&self, l: usize) -> Option<&RopeConfig> {
        if !self.has_rope() || !self.layer_rope[l] {
            return None;
        }
        Some(match (&self.rope_local, self.layer_window[l]) {
            (Some(local), Some(_)) => local,
            _ => &self.rope,
        })
    }
}

/// Typed access to the `{arch}.*` keys of a GGUF file, with errors naming the key.
pub(crate) struct GgufKeys<'a> {
    pub gguf: &'a GgufFile,
    pub arch: &'a str,
}

impl GgufKeys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    pub fn err(&self, key: &str, msg: impl Into<String>) -> ModelError {
        ModelError::Config {
            path: self.gguf.path().to_path_buf(),
            key: key.to_string(),
            msg: msg.into(),
        }
    }

    /// A positive integer, required.
    pub fn usize(&self, k: &str) -> Result<usize> {
        let key = self.key(k);
        match self.gguf.metadata(&key) {
            None => Err(self.err(&key, "missing (required by this architecture)")),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .filter(|&x| x > 0)
                .ok_or_else(|| self.err(&key, format!("must be a positive integer, got {v}"))),
        }
    }

    /// A positive integer, optional.
    pub fn usize_opt(&self, k: &str) -> Result<Option<usize>> {
        if self.gguf.metadata(&self.key(k)).is_none() {
            return Ok(None);
        }
        self.usize(k).map(Some)
    }

    /// A positive integer per layer: an array of `n_layer` entries, or one value for every
    /// layer (llama.cpp's `get_key_or_arr`); `None` when absent.
    pub fn usize_per_layer(&self, k: &str, n_layer: usize) -> Result<Option<Vec<usize>>> {
        let key = self.key(k);
        let Some(v) = self.gguf.metadata(&key) else {
            return Ok(None);
        };
        let MetaValue::Array(a) = v else {
            return self.usize(k).map(|x| Some(vec![x; n_layer]));
        };
        let bad = || {
            self.err(
                &key,
                format!("expected {n_layer} positive integers, got {v}"),
            )
        };
        let vals: Vec<u64> = match a {
            MetaArray::U32(x) => x.iter().map(|&y| y as u64).collect(),
            MetaArray::I32(x) => x.iter().map(|&y| y.max(0) as u64).collect(),
            MetaArray::U64(x) => x.clone(),
            MetaArray::I64(x) => x.iter().map(|&y| y.max(0) as u64).collect(),
            _ => return Err(bad()),
        };
        if vals.len() != n_layer || vals.contains(&0) {
            return Err(bad());
        }
        Ok(Some(vals.into_iter().map(|x| x as usize).collect()))
    }

    /// A finite float, optional.
    pub fn f32_opt(&self, k: &str) -> Result<Option<f32>> {
        let key = self.key(k);
        match self.gguf.metadata(&key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x as f32)),
                _ => Err(self.err(&key, format!("must be a finite number, got {v}"))),
            },
        }
    }

    pub fn str_opt(&self, k: &str) -> Option<&str> {
        self.gguf.get_str(&self.key(k))
    }
}

impl ModelConfig {
    /// Reads the hyper-parameters every decoder family shares. `style` is the family's RoPE
    /// layout; the vocabulary size comes from the token embedding when the key is absent.
    pub(crate) fn from_gguf(
        gguf: &GgufFile,
        arch: &str,
        style: RopeStyle,
        vocab_from_embd: usize,
    ) -> Result<ModelConfig> {
        let k = GgufKeys { gguf, arch };
        let n_embd = k.usize("embedding_length")?;
        let n_layer = k.usize("block_count")?;
        let n_head = k.usize("attention.head_count")?;
        let layer_n_head_kv = k
            .usize_per_layer("attention.head_count_kv", n_layer)?
            .unwrap_or_else(|| vec![n_head; n_layer]);
        if let Some(bad) = layer_n_head_kv.iter().find(|&&h| n_head % h != 0) {
            return Err(k.err(
                &format!("{arch}.attention.head_count_kv"),
                format!("{bad} does not divide the {n_head} query heads"),
            ));
        }
        let n_head_kv = layer_n_head_kv[0];
        let head_dim = match k.usize_opt("attention.key_length")? {
            Some(d) => d,
            None if n_embd % n_head == 0 => n_embd / n_head,
            None => {
                return Err(k.err(
                    &format!("{arch}.attention.head_count"),
                    format!("{n_head} heads do not divide the embedding width {n_embd}"),
                ));
            }
        };
        if let Some(v) = k.usize_opt("attention.value_length")?
            && v != head_dim
        {
            return Err(k.err(
                &format!("{arch}.attention.value_length"),
                format!("{v} differs from the key length {head_dim}, which mica does not support"),
            ));
        }
        // A model whose every layer is a mixture of experts may give only the experts'
        // width (Qwen3.5-MoE).
        let layer_n_ff = match k.usize_per_layer("feed_forward_length", n_layer)? {
            Some(v) => v,
            None => match k.usize_opt("expert_feed_forward_length")? {
                Some(f) => vec![f; n_layer],
                None => vec![k.usize("feed_forward_length")?; n_layer],
            },
        };
        let n_ff = layer_n_ff[0];
        let n_ctx_train = k.usize_opt("context_length")?.unwrap_or(2048);
        let norm_eps = k
            .f32_opt("attention.layer_norm_rms_epsilon")?
            .unwrap_or(1e-5);
        let n_vocab = k.usize_opt("vocab_size")?.unwrap_or(vocab_from_embd);
        if n_vocab != vocab_from_embd {
            return Err(k.err(
                &format!("{arch}.vocab_size"),
                format!("{n_vocab} differs from the token embedding's {vocab_from_embd} rows"),
            ));
        }

        let n_dims = k.usize_opt("rope.dimension_count")?.unwrap_or(head_dim);
        if n_dims > head_dim || n_dims % 2 != 0 {
            return Err(k.err(
                &format!("{arch}.rope.dimension_count"),
                format!("{n_dims} must be even and at most the head size {head_dim}"),
            ));
        }
        let freq_base = k.f32_opt("rope.freq_base")?.unwrap_or(10000.0);
        let scaling = k.str_opt("rope.scaling.type").unwrap_or("none");
        let factor = k.f32_opt("rope.scaling.factor")?;
        let mut yarn = None;
        let freq_scale = match scaling {
            "none" => 1.0,
            // As llama.cpp: the correction range truncated, cos and sin scaled by
            // `1 + 0.1 ln(factor)`.
            "yarn" => {
                let f = factor.filter(|&f| f > 0.0).ok_or_else(|| {
                    k.err(
                        &format!("{arch}.rope.scaling.factor"),
                        "YaRN needs a positive factor",
                    )
                })?;
                for unsupported in ["yarn_attn_factor", "yarn_log_multiplier"] {
                    if gguf
                        .metadata(&format!("{arch}.rope.scaling.{unsupported}"))
                        .is_some()
                    {
                        return Err(k.err(
                            &format!("{arch}.rope.scaling.{unsupported}"),
                            "not supported yet",
                        ));
                    }
                }
                let orig = k
                    .usize_opt("rope.scaling.original_context_length")?
                    .ok_or_else(|| {
                        k.err(
                            &format!("{arch}.rope.scaling.original_context_length"),
                            "missing (required by YaRN)",
                        )
                    })?;
                let beta_fast = k.f32_opt("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0);
                let beta_slow = k.f32_opt("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0);
                let ff = yarn_factors(n_dims, freq_base, f, orig, (beta_fast, beta_slow), true);
                yarn = Some((ff, yarn_mscale(f)));
                1.0
            }
            "linear" => match factor {
                Some(f) if f > 0.0 => 1.0 / f,
                _ => {
                    return Err(k.err(
                        &format!("{arch}.rope.scaling.factor"),
                        "linear RoPE scaling needs a positive factor",
                    ));
                }
            },
            other => {
                return Err(k.err(
                    &format!("{arch}.rope.scaling.type"),
                    format!("RoPE scaling '{other}' is not supported yet (none, linear, yarn, and Llama-3 frequency factors are)"),
                ));
            }
        };
        // An explicit freq_scale key (older converters) overrides the factor.
        let freq_scale = k
            .f32_opt("rope.scale_linear")?
            .map_or(freq_scale, |f| 1.0 / f);

        Ok(ModelConfig {
            arch: arch.to_string(),
            name: gguf.get_str("general.name").map(str::to_string),
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            layer_head_dim: vec![head_dim; n_layer],
            layer_n_head_kv,
            layer_kv_from: vec![None; n_layer],
            n_ff,
            layer_n_ff,
            n_ctx_train,
            norm_eps,
            rope: RopeConfig {
                style,
                n_dims,
                freq_base,
                freq_scale,
                freq_factors: yarn.as_ref().map(|y| y.0.clone()),
                attn_factor: yarn.as_ref().map_or(1.0, |y| y.1),
            },
            rope_local: None,
            long_rope: None,
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
}
