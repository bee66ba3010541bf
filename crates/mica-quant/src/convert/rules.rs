//! Which type each tensor gets for a chosen file type: llama.cpp's rules
//! (`llama_tensor_get_type` in `src/llama-quant.cpp`), restated for the types mica writes.
//!
//! - Only tensors of rank ≥ 2 whose name ends in `weight` are quantized, never norms,
//!   MoE routers, positional embeddings or conv1d kernels; the rest keep their source type.
//! - For a quantized target, the output projection (and the token embedding when the two
//!   are tied, i.e. the file has no `output.weight`) becomes Q6_K (Q8_0 stays Q8_0, and a
//!   row length that is not a multiple of the block gives Q8_0).
//! - IQ4_NL / IQ4_XS: attention V gets Q5_K when 4+ query heads share a KV head, and without
//!   an importance matrix FFN down gets Q5_K in the first eighth of the layers. TQ1_0 /
//!   TQ2_0: an untied token embedding gets Q4_K.
//! - IQ2_XS: the output projection (and a tied embedding) Q5_K, an untied token embedding
//!   Q2_K, attention V Q4_K when 4+ query heads share a KV head and Q2_K otherwise, FFN down
//!   Q2_K in the first eighth of the layers. Its tensors need an importance matrix.
//! - The `_M`/`_L` mixes give more bits to attention V and FFN down in the layers
//!   `use_more_bits` picks (the first and last eighth, and every third in between).
//! - A row whose length is not a multiple of the type's block falls back as llama.cpp does
//!   (Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, Q2_K/Q3_K/TQ1_0/TQ2_0 → Q4_0, IQ4_XS and the
//!   grid i-quants → IQ4_NL, then F16).
//!
//! The other grid i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_S, IQ3_XXS, IQ3_S) and MXFP4 are read
//! but have no file type here: mica has no quantizer for the former, and llama.cpp's only
//! MXFP4 file type is for MoE experts.
//!
//! `q4_k`, `q5_k` and `q3_k` mean the `_M` mixes, as llama-quantize's aliases do.

use mica_kernels::DType;

/// A file type: the base type and the mix rules around it. Ids are llama.cpp's
/// `llama_ftype` (written to `general.file_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum FileType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
    TQ1_0,
    TQ2_0,
    IQ2_XS,
}

const NAMES: &[(&str, FileType)] = &[
    ("f32", FileType::F32),
    ("f16", FileType::F16),
    ("bf16", FileType::BF16),
    ("q4_0", FileType::Q4_0),
    ("q4_1", FileType::Q4_1),
    ("q5_0", FileType::Q5_0),
    ("q5_1", FileType::Q5_1),
    ("q8_0", FileType::Q8_0),
    ("q2_k", FileType::Q2_K),
    ("q3_k_s", FileType::Q3_K_S),
    ("q3_k_m", FileType::Q3_K_M),
    ("q3_k", FileType::Q3_K_M),
    ("q3_k_l", FileType::Q3_K_L),
    ("q4_k_s", FileType::Q4_K_S),
    ("q4_k_m", FileType::Q4_K_M),
    ("q4_k", FileType::Q4_K_M),
    ("q5_k_s", FileType::Q5_K_S),
    ("q5_k_m", FileType::Q5_K_M),
    ("q5_k", FileType::Q5_K_M),
    ("q6_k", FileType::Q6_K),
    ("iq4_nl", FileType::IQ4_NL),
    ("iq4_xs", FileType::IQ4_XS),
    ("tq1_0", FileType::TQ1_0),
    ("tq2_0", FileType::TQ2_0),
    ("iq2_xs", FileType::IQ2_XS),
];

impl FileType {
    pub fn parse(s: &str) -> Option<FileType> {
        let l = s.to_ascii_lowercase();
        NAMES.iter().find(|(n, _)| *n == l).map(|&(_, t)| t)
    }

    /// Every accepted name, for error messages.
    pub fn names() -> String {
        NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
    }

    pub fn name(self) -> &'static str {
        NAMES
            .iter()
            .find(|(_, t)| *t == self)
            .map(|(n, _)| *n)
            .unwrap_or("?")
    }

    /// llama.cpp's `llama_ftype` value.
    pub fn ftype_id(self) -> u32 {
        match self {
            FileType::F32 => 0,
            FileType::F16 => 1,
            FileType::Q4_0 => 2,
            FileType::Q4_1 => 3,
            FileType::Q8_0 => 7,
            FileType::Q5_0 => 8,
            FileType::Q5_1 => 9,
            FileType::Q2_K => 10,
            FileType::Q3_K_S => 11,
            FileType::Q3_K_M => 12,
            FileType::Q3_K_L => 13,
            FileType::Q4_K_S => 14,
            FileType::Q4_K_M => 15,
            FileType::Q5_K_S => 16,
            FileType::Q5_K_M => 17,
            FileType::Q6_K => 18,
            FileType::BF16 => 32,
            FileType::IQ4_NL => 25,
            FileType::IQ4_XS => 30,
            FileType::TQ1_0 => 36,
            FileType::TQ2_0 => 37,
            FileType::IQ2_XS => 20,
        }
    }

    /// The default type of quantized tensors.
    pub fn base(self) -> DType {
        match self {
            FileType::F32 => DType::F32,
            FileType::F16 => DType::F16,
            FileType::BF16 => DType::BF16,
            FileType::Q4_0 => DType::Q4_0,
            FileType::Q4_1 => DType::Q4_1,
            FileType::Q5_0 => DType::Q5_0,
            FileType::Q5_1 => DType::Q5_1,
            FileType::Q8_0 => DType::Q8_0,
            FileType::Q2_K => DType::Q2_K,
            FileType::Q3_K_S | FileType::Q3_K_M | FileType::Q3_K_L => DType::Q3_K,
            FileType::Q4_K_S | FileType::Q4_K_M => DType::Q4_K,
            FileType::Q5_K_S | FileType::Q5_K_M => DType::Q5_K,
            FileType::Q6_K => DType::Q6_K,
            FileType::IQ4_NL => DType::IQ4_NL,
            FileType::IQ4_XS => DType::IQ4_XS,
            FileType::TQ1_0 => DType::TQ1_0,
            FileType::TQ2_0 => DType::TQ2_0,
            FileType::IQ2_XS => DType::IQ2_XS,
        }
    }

    /// Whether the base type is a block-quantized one (not F32, F16 or BF16).
    pub fn is_quantized(self) -> bool {
        !matches!(self, FileType::F32 | FileType::F16 | FileType::BF16)
    }
}

/// What the rules need to know about the model.
pub struct ModelShape {
    pub n_layer: usize,
    /// Query heads per KV head.
    pub n_gqa: usize,
    /// The file has no separate `output.weight`.
    pub tied_embeddings: bool,
    /// The conversion uses an importance matrix (llama.cpp's `has_imatrix`: some mixes
    /// give more bits where there is none).
    pub has_imatrix: bool,
}

/// One tensor as the rules see it.
pub struct TensorDesc<'a> {
    pub name: &'a str,
    /// Innermost first.
    pub shape: &'a [u64],
}

/// llama.cpp's `tensor_allows_quantization`, for the tensor names of the architectures
/// mica runs (and the generic exclusions).
pub fn allows_quantization(t: &TensorDesc) -> bool {
    let n = t.name;
    t.shape.len() >= 2
        && n.ends_with("weight")
        && !n.contains("_norm.weight")
        && !n.contains("ffn_gate_inp.weight")
        && !n.contains("altup")
        && !n.contains("laurel")
        && !n.contains("per_layer_model_proj")
        && n != "position_embd.weight"
        && n != "token_types.weight"
        && !n.contains("ssm_conv1d")
        && !n.contains("attn_rel_b.weight")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Category {
    Output,
    TokenEmbd,
    AttnV,
    AttnOutput,
    FfnDown,
    Other,
}

fn category(name: &str) -> Category {
    if name == "output.weight" {
        Category::Output
    } else if name == "token_embd.weight" {
        Category::TokenEmbd
    } else if name.contains("attn_qkv.weight")
        || name.contains("attn_kv_b.weight")
        || name.contains("attn_v.weight")
    {
        Category::AttnV
    } else if name.contains("attn_output.weight") {
        Category::AttnOutput
    } else if name.contains("ffn_down") {
        Category::FfnDown
    } else {
        Category::Other
    }
}

/// The layer number of `blk.N.…`.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third.
fn use_more_bits(i: usize, n: usize) -> bool {
    let (i, n) = (i as i64, n as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The type of one tensor, given the tensor's source type (kept when it is not quantized).
pub fn tensor_type(ft: FileType, m: &ModelShape, t: &TensorDesc, source: DType) -> DType {
    if !allows_quantization(t) {
        return source;
    }
    let mut ty = ft.base();
    if !ft.is_quantized() {
        return ty;
    }
    let cat = category(t.name);
    let nx = t.shape[0] as usize;
    let layer = layer_of(t.name).unwrap_or(0);
    if cat == Category::Output || (m.tied_embeddings && cat == Category::TokenEmbd) {
        if !nx.is_multiple_of(ty.block_size()) {
            ty = DType::Q8_0;
        } else if ft == FileType::IQ2_XS {
            ty = DType::Q5_K;
        } else if ty != DType::Q8_0 {
            ty = DType::Q6_K;
        }
    } else if cat == Category::TokenEmbd {
        if matches!(ft, FileType::TQ1_0 | FileType::TQ2_0) {
            ty = DType::Q4_K;
        } else if ft == FileType::IQ2_XS {
            ty = DType::Q2_K;
        }
    } else if ft == FileType::IQ2_XS {
        // llama.cpp's branch for its 1- and 2-bit i-quant file types, which replaces the
        // per-category rules below.
        ty = match cat {
            Category::AttnV if m.n_gqa >= 4 => DType::Q4_K,
            Category::AttnV => DType::Q2_K,
            Category::FfnDown if layer < m.n_layer / 8 => DType::Q2_K,
            _ => ty,
        };
    } else if cat == Category::AttnV {
        ty = match ft {
            FileType::IQ4_NL | FileType::IQ4_XS if m.n_gqa >= 4 => DType::Q5_K,
            FileType::Q2_K if m.n_gqa >= 4 => DType::Q4_K,
            FileType::Q2_K => DType::Q3_K,
            FileType::Q3_K_M if layer < 2 => DType::Q5_K,
            FileType::Q3_K_M => DType::Q4_K,
            FileType::Q3_K_L => DType::Q5_K,
            FileType::Q4_K_M | FileType::Q5_K_M if use_more_bits(layer, m.n_layer) => DType::Q6_K,
            FileType::Q4_K_S if layer < 4 => DType::Q5_K,
            _ => ty,
        };
    } else if cat == Category::FfnDown {
        let n = m.n_layer;
        ty = match ft {
            FileType::Q2_K => DType::Q3_K,
            FileType::Q3_K_M if layer < n / 16 => DType::Q5_K,
            FileType::Q3_K_M => DType::Q4_K,
            FileType::Q3_K_L => DType::Q5_K,
            FileType::Q4_K_M | FileType::Q5_K_M if use_more_bits(layer, n) => DType::Q6_K,
            FileType::IQ4_NL | FileType::IQ4_XS if layer < n / 8 && !m.has_imatrix => DType::Q5_K,
            FileType::Q4_K_S if layer < n / 8 => DType::Q5_K,
            _ => ty,
        };
    } else if cat == Category::AttnOutput {
        ty = match ft {
            FileType::Q2_K => DType::Q3_K,
            FileType::Q3_K_M => DType::Q4_K,
            FileType::Q3_K_L => DType::Q5_K,
            _ => ty,
        };
    }
    fallback(ty, nx)
}

/// llama.cpp's `tensor_type_fallback`: a type whose block divides the row length.
pub fn fallback(ty: DType, nx: usize) -> DType {
    if nx.is_multiple_of(ty.block_size()) {
        return ty;
    }
    let alt = match ty {
        DType::Q2_K | DType::Q3_K | DType::TQ1_0 | DType::TQ2_0 => DType::Q4_0,
        DType::IQ4_XS
        | DType::IQ1_S
        | DType::IQ1_M
        | DType::IQ2_XXS
        | DType::IQ2_XS
        | DType::IQ2_S
        | DType::IQ3_XXS
        | DType::IQ3_S => DType::IQ4_NL,
        DType::Q4_K => DType::Q5_0,
        DType::Q5_K => DType::Q5_1,
        DType::Q6_K => DType::Q8_0,
        other => other,
    };
    if nx.is_multiple_of(alt.block_size()) {
        alt
    } else {
        DType::F16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(tied: bool) -> ModelShape {
        ModelShape {
            n_layer: 30,
            n_gqa: 3,
            tied_embeddings: tied,
            has_imatrix: false,
        }
    }

    fn ty(ft: FileType, name: &str, shape: &[u64], tied: bool) -> DType {
        tensor_type(ft, &m(tied), &TensorDesc { name, shape }, DType::F32)
    }

    #[test]
    fn norms_and_vectors_keep_their_type() {
        assert_eq!(
            ty(FileType::Q4_0, "blk.0.attn_norm.weight", &[576], true),
            DType::F32
        );
        assert_eq!(
            ty(FileType::Q4_0, "blk.0.attn_q.bias", &[576, 1], true),
            DType::F32
        );
    }

    #[test]
    fn output_and_tied_embedding_get_q6_k() {
        assert_eq!(
            ty(FileType::Q4_K_M, "token_embd.weight", &[1024, 4096], true),
            DType::Q6_K
        );
        assert_eq!(
            ty(FileType::Q4_K_M, "token_embd.weight", &[1024, 4096], false),
            DType::Q4_K
        );
        assert_eq!(
            ty(FileType::Q4_0, "output.weight", &[1024, 4096], false),
            DType::Q6_K
        );
        assert_eq!(
            ty(FileType::Q8_0, "output.weight", &[1024, 4096], false),
            DType::Q8_0
        );
        // SmolLM2 (576 wide, tied): Q6_K does not fit, Q8_0 as llama.cpp.
        assert_eq!(
            ty(FileType::Q4_0, "token_embd.weight", &[576, 49152], true),
            DType::Q8_0
        );
        // 896 is not a multiple of 256: Q8_0.
        assert_eq!(
            ty(FileType::Q4_K_M, "output.weight", &[896, 10], false),
            DType::Q8_0
        );
    }

    #[test]
    fn q4_k_m_gives_more_bits_where_llama_cpp_does() {
        assert_eq!(
            ty(FileType::Q4_K_M, "blk.0.attn_v.weight", &[1024, 256], true),
            DType::Q6_K
        );
        assert_eq!(
            ty(FileType::Q4_K_M, "blk.4.attn_v.weight", &[1024, 256], true),
            DType::Q4_K
        );
        assert_eq!(
            ty(
                FileType::Q4_K_M,
                "blk.5.ffn_down.weight",
                &[1536, 576],
                true
            ),
            DType::Q6_K
        );
        assert_eq!(
            ty(
                FileType::Q4_K_M,
                "blk.29.ffn_down.weight",
                &[1536, 576],
                true
            ),
            DType::Q6_K
        );
        assert_eq!(
            ty(FileType::Q4_K_M, "blk.4.attn_q.weight", &[1024, 1024], true),
            DType::Q4_K
        );
    }

    #[test]
    fn unaligned_rows_fall_back() {
        // 576 % 256 != 0.
        assert_eq!(fallback(DType::Q4_K, 576), DType::Q5_0);
        assert_eq!(fallback(DType::Q6_K, 576), DType::Q8_0);
        assert_eq!(fallback(DType::Q4_0, 40), DType::F16);
        assert_eq!(fallback(DType::Q4_K, 512), DType::Q4_K);
        assert_eq!(
            ty(FileType::Q4_K_M, "blk.4.attn_q.weight", &[576, 576], true),
            DType::Q5_0
        );
    }

    #[test]
    fn iq4_and_ternary_file_types_follow_llama_cpp() {
        for (name, ft, id) in [
            ("iq4_nl", FileType::IQ4_NL, 25),
            ("IQ4_XS", FileType::IQ4_XS, 30),
            ("tq1_0", FileType::TQ1_0, 36),
            ("tq2_0", FileType::TQ2_0, 37),
        ] {
            assert_eq!(FileType::parse(name), Some(ft));
            assert_eq!(ft.ftype_id(), id);
        }
        let xs = FileType::IQ4_XS;
        // SmolLM2: 576-wide rows are not whole IQ4_XS blocks, IQ4_NL instead; 1536 are.
        assert_eq!(
            ty(xs, "blk.3.attn_q.weight", &[576, 576], true),
            DType::IQ4_NL
        );
        assert_eq!(
            ty(xs, "blk.9.ffn_down.weight", &[1536, 576], true),
            DType::IQ4_XS
        );
        // The tied embedding: Q8_0 for a row that is no whole super-block, else Q6_K.
        assert_eq!(
            ty(xs, "token_embd.weight", &[576, 49152], true),
            DType::Q8_0
        );
        assert_eq!(
            ty(xs, "token_embd.weight", &[1024, 49152], true),
            DType::Q6_K
        );
        // FFN down of the first eighth: Q5_K without an importance matrix, not with one.
        assert_eq!(
            ty(xs, "blk.0.ffn_down.weight", &[1536, 576], true),
            DType::Q5_K
        );
        let with = ModelShape {
            has_imatrix: true,
            ..m(true)
        };
        let d = TensorDesc {
            name: "blk.0.ffn_down.weight",
            shape: &[1536, 576],
        };
        assert_eq!(tensor_type(xs, &with, &d, DType::F32), DType::IQ4_XS);
        // Attention V with 4+ query heads per KV head.
        let gqa = ModelShape {
            n_gqa: 4,
            ..m(true)
        };
        let v = TensorDesc {
            name: "blk.5.attn_v.weight",
            shape: &[1024, 256],
        };
        assert_eq!(tensor_type(xs, &gqa, &v, DType::F32), DType::Q5_K);
        assert_eq!(
            ty(xs, "blk.5.attn_v.weight", &[1024, 256], true),
            DType::IQ4_XS
        );
        // Ternary: untied embedding Q4_K, rows of 576 fall back to Q4_0.
        let tq = FileType::TQ2_0;
        assert_eq!(
            ty(tq, "token_embd.weight", &[1024, 100], false),
            DType::Q4_K
        );
        assert_eq!(
            ty(tq, "blk.0.attn_q.weight", &[1024, 1024], false),
            DType::TQ2_0
        );
        assert_eq!(
            ty(tq, "blk.0.attn_q.weight", &[576, 576], false),
            DType::Q4_0
        );
    }

    #[test]
    fn iq2_xs_file_type_follows_llama_cpp() {
        let ft = FileType::IQ2_XS;
        assert_eq!(FileType::parse("iq2_xs"), Some(ft));
        assert_eq!(ft.ftype_id(), 20);
        // SmolLM2 (30 layers, 3 query heads per KV head, tied embedding, 576 wide).
        let cases: [(&str, &[u64], DType); 9] = [
            ("token_embd.weight", &[576, 49152], DType::Q8_0),
            ("blk.4.attn_q.weight", &[576, 576], DType::IQ4_NL),
            ("blk.4.attn_v.weight", &[576, 192], DType::Q4_0),
            ("blk.4.attn_output.weight", &[576, 576], DType::IQ4_NL),
            ("blk.2.ffn_down.weight", &[1536, 576], DType::Q2_K),
            ("blk.3.ffn_down.weight", &[1536, 576], DType::IQ2_XS),
            ("blk.3.ffn_up.weight", &[576, 1536], DType::IQ4_NL),
            ("blk.3.ffn_up.weight", &[1024, 1536], DType::IQ2_XS),
            ("blk.3.attn_v.weight", &[1024, 256], DType::Q2_K),
        ];
        for (name, shape, want) in cases {
            assert_eq!(ty(ft, name, shape, true), want, "{name} {shape:?}");
        }
        // Whole super-blocks: the output Q5_K, an untied embedding Q2_K, attention V Q4_K
        // with 4+ query heads per KV head.
        assert_eq!(ty(ft, "output.weight", &[1024, 100], false), DType::Q5_K);
        assert_eq!(
            ty(ft, "token_embd.weight", &[1024, 100], false),
            DType::Q2_K
        );
        let gqa = ModelShape {
            n_gqa: 4,
            ..m(true)
        };
        let v = TensorDesc {
            name: "blk.5.attn_v.weight",
            shape: &[1024, 256],
        };
        assert_eq!(tensor_type(ft, &gqa, &v, DType::F32), DType::Q4_K);
    }
}
