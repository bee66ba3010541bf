//! `--tensor-type REGEX=TYPE`: per-tensor types chosen by the user, on top of the rules of
//! the file type (and fixed under `mix`), as llama-quantize's `--tensor-type`.

use super::Planned;
use super::rules::{self, TensorDesc};
use crate::error::{QuantError, Result};
use mica_formats::ggml_types::GgmlType;
use mica_kernels::DType;
use regex::Regex;

/// One `REGEX=TYPE` rule: tensors whose name matches get the type.
#[derive(Clone, Debug)]
pub struct TensorTypeRule {
    pattern: Regex,
    text: String,
    ty: DType,
}

impl TensorTypeRule {
    /// Parses `REGEX=TYPE` (the last `=` splits, so the expression may hold one).
    pub fn parse(arg: &str) -> Result<TensorTypeRule> {
        let rule = || arg.to_string();
        let Some((pat, ty)) = arg.rsplit_once('=') else {
            return Err(QuantError::TensorTypeSyntax { rule: rule() });
        };
        let pattern = Regex::new(pat).map_err(|cause| QuantError::TensorTypeRegex {
            rule: rule(),
            cause,
        })?;
        let ty = DType::from_name(ty)
            .filter(|t| !matches!(t, DType::Q8_1 | DType::Q8_K))
            .ok_or_else(|| QuantError::TensorTypeUnknown {
                rule: rule(),
                ty: ty.to_string(),
            })?;
        Ok(TensorTypeRule {
            pattern,
            text: pat.to_string(),
            ty,
        })
    }

    /// The type the rule gives.
    pub fn dtype(&self) -> DType {
        self.ty
    }
}

/// Applies the rules to the quantizable tensors of `planned` (those the llama.cpp rules would
/// quantize: matrices, not norms) and returns the indices of the tensors they set. A rule
/// that matches no tensor, or a type whose block does not divide a matched tensor's rows,
/// is an error.
pub(crate) fn apply(rules_: &[TensorTypeRule], planned: &mut [Planned]) -> Result<Vec<usize>> {
    let mut set = Vec::new();
    let mut used = vec![false; rules_.len()];
    for (i, p) in planned.iter_mut().enumerate() {
        let desc = TensorDesc {
            name: &p.info.name,
            shape: &p.info.shape,
        };
        if !rules::allows_quantization(&desc) {
            continue;
        }
        let Some(k) = rules_.iter().position(|o| o.pattern.is_match(&p.info.name)) else {
            continue;
        };
        used[k] = true;
        let o = &rules_[k];
        let row = p.info.row_len() as usize;
        if o.ty.row_bytes(row).is_none() {
            return Err(QuantError::TensorTypeBlock {
                rule: format!("{}={}", o.text, o.ty.name().to_ascii_lowercase()),
                tensor: p.info.name.clone(),
                row_len: row,
                ty: o.ty,
            });
        }
        p.target = GgmlType(o.ty.ggml_id());
        set.push(i);
    }
    if let Some(k) = used.iter().position(|u| !u) {
        return Err(QuantError::TensorTypeUnmatched {
            pattern: rules_[k].text.clone(),
        });
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_or_say_what_is_wrong() {
        let r = TensorTypeRule::parse(r"blk\.[0-3]\.ffn_down=q6_k").unwrap();
        assert_eq!(r.dtype(), DType::Q6_K);
        assert!(r.pattern.is_match("blk.2.ffn_down.weight"));
        // The last '=' splits.
        assert_eq!(TensorTypeRule::parse("a=b=q8_0").unwrap().text, "a=b");
        for (arg, want) in [
            ("attn_v", "expected REGEX=TYPE"),
            ("attn_v=q9_9", "unknown type 'q9_9'"),
            ("attn_v=q8_1", "unknown type 'q8_1'"),
            ("attn_(=q8_0", "bad regular expression"),
        ] {
            let e = TensorTypeRule::parse(arg).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains(arg), "{arg}: {e}");
        }
    }
}
