//! Element and block types of tensors, numbered as ggml numbers them (GGUF stores these ids).
//!
//! A quantized type packs `block_size()` elements into `type_size()` bytes. Every weight type
//! has a *vec-dot type*: the format the activations are quantized into before a dot product
//! with a row of that weight, exactly as ggml pairs them (Q4_1 with Q8_1, k-quants with Q8_K,
//! ...). Following ggml's pairing is what lets mica reproduce llama.cpp's numerics.

use std::fmt;

/// A tensor element type mica can compute with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(non_camel_case_types)]
pub enum DType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    /// Activation-only format (Q8_0 plus the block sum), the partner of Q4_1 and Q5_1.
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    /// Activation-only format, the partner of every k-quant and of the 256-element i-quants.
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    IQ1_M,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// Every ggml type id with its name, including the ones mica cannot compute with, so that
/// an error can name the type a file uses.
const GGML_TYPE_NAMES: &[(u32, &str)] = &[
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (4, "Q4_2 (removed)"),
    (5, "Q4_3 (removed)"),
    (6, "Q5_0"),
    (7, "Q5_1"),
    (8, "Q8_0"),
    (9, "Q8_1"),
    (10, "Q2_K"),
    (11, "Q3_K"),
    (12, "Q4_K"),
    (13, "Q5_K"),
    (14, "Q6_K"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (30, "BF16"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (39, "MXFP4"),
];

/// The name ggml gives a type id, or `None` for an id ggml never assigned.
pub fn ggml_type_name(id: u32) -> Option<&'static str> {
    GGML_TYPE_NAMES
        .iter()
        .find(|(i, _)| *i == id)
        .map(|(_, n)| *n)
}

impl DType {
    /// All types mica computes with.
    pub const ALL: [DType; 27] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q8_1,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_K,
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ3_XXS,
        DType::IQ1_S,
        DType::IQ4_NL,
        DType::IQ3_S,
        DType::IQ2_S,
        DType::IQ4_XS,
        DType::IQ1_M,
        DType::TQ1_0,
        DType::TQ2_0,
        DType::MXFP4,
    ];

    /// The types a weight tensor may have (activation-only formats excluded).
    pub const WEIGHT_TYPES: [DType; 25] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ3_XXS,
        DType::IQ1_S,
        DType::IQ4_NL,
        DType::IQ3_S,
        DType::IQ2_S,
        DType::IQ4_XS,
        DType::IQ1_M,
        DType::TQ1_0,
        DType::TQ2_0,
        DType::MXFP4,
    ];

    /// The ggml type id (as stored in GGUF tensor infos).
    pub const fn ggml_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q8_1 => 9,
            DType::Q2_K => 10,
            DType::Q3_K => 11,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
            DType::Q8_K => 15,
            DType::BF16 => 30,
            DType::IQ2_XXS => 16,
            DType::IQ2_XS => 17,
            DType::IQ3_XXS => 18,
            DType::IQ1_S => 19,
            DType::IQ4_NL => 20,
            DType::IQ3_S => 21,
            DType::IQ2_S => 22,
            DType::IQ4_XS => 23,
            DType::IQ1_M => 29,
            DType::TQ1_0 => 34,
            DType::TQ2_0 => 35,
            DType::MXFP4 => 39,
        }
    }

    /// The type for a ggml id, if mica computes with it.
    pub fn from_ggml_id(id: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|t| t.ggml_id() == id)
    }

    /// ggml's name for the type ("Q4_K", "BF16", ...).
    pub fn name(self) -> &'static str {
        ggml_type_name(self.ggml_id()).unwrap_or("?")
    }

    /// Parses ggml's name, case-insensitively.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Elements per block (1 for plain float types).
    pub const fn block_size(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q8_1
            | DType::IQ4_NL
            | DType::MXFP4 => 32,
            DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
            | DType::Q8_K
            | DType::IQ2_XXS
            | DType::IQ2_XS
            | DType::IQ3_XXS
            | DType::IQ1_S
            | DType::IQ3_S
            | DType::IQ2_S
            | DType::IQ4_XS
            | DType::IQ1_M
            | DType::TQ1_0
            | DType::TQ2_0 => 256,
        }
    }

    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q8_0 => 34,
            DType::Q8_1 => 36,
            DType::Q2_K => 84,
            DType::Q3_K => 110,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
            DType::Q8_K => 292,
            DType::IQ2_XXS => 66,
            DType::IQ2_XS => 74,
            DType::IQ3_XXS => 98,
            DType::IQ1_S => 50,
            DType::IQ4_NL => 18,
            DType::IQ3_S => 110,
            DType::IQ2_S => 82,
            DType::IQ4_XS => 136,
            DType::IQ1_M => 56,
            DType::TQ1_0 => 54,
            DType::TQ2_0 => 66,
            DType::MXFP4 => 17,
        }
    }

    /// True for block-quantized types.
    pub const fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// The format activations are converted into for a dot product with a row of this type.
    pub const fn vec_dot_type(self) -> DType {
        match self {
            DType::F32 => DType::F32,
            DType::F16 => DType::F16,
            DType::BF16 => DType::BF16,
            DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::IQ4_NL | DType::MXFP4 => DType::Q8_0,
            DType::Q4_1 | DType::Q5_1 => DType::Q8_1,
            DType::Q8_1 => DType::Q8_1,
            DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
            | DType::Q8_K
            | DType::IQ2_XXS
            | DType::IQ2_XS
            | DType::IQ3_XXS
            | DType::IQ1_S
            | DType::IQ3_S
            | DType::IQ2_S
            | DType::IQ4_XS
            | DType::IQ1_M
            | DType::TQ1_0
            | DType::TQ2_0 => DType::Q8_K,
        }
    }

    /// Bytes taken by `n` elements, or `None` when `n` is not a whole number of blocks or
    /// the size overflows.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.type_size())
    }

    /// Average bits per weight.
    pub fn bits_per_weight(self) -> f64 {
        (self.type_size() * 8) as f64 / self.block_size() as f64
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_names_parse() {
        for t in DType::ALL {
            assert_eq!(DType::from_ggml_id(t.ggml_id()), Some(t));
            assert_eq!(DType::from_name(t.name()), Some(t));
        }
        assert_eq!(DType::from_ggml_id(16), Some(DType::IQ2_XXS));
        assert_eq!(DType::from_ggml_id(39), Some(DType::MXFP4));
        assert_eq!(DType::from_ggml_id(24), None);
        assert_eq!(ggml_type_name(24), Some("I8"));
        assert_eq!(ggml_type_name(1000), None);
    }

    #[test]
    fn row_bytes_rejects_partial_blocks() {
        assert_eq!(DType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(DType::Q4_K.row_bytes(100), None);
        assert_eq!(DType::F16.row_bytes(3), Some(6));
        // (2^59 - 1) blocks of 34 bytes overflow usize.
        assert_eq!(DType::Q8_0.row_bytes(usize::MAX / 32 * 32), None);
    }
}
