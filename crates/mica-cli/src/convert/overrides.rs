//! `--tensor-type REGEX=TYPE`: per-tensor types chosen by the user, on top of the rules of
//! `--type` (and fixed under `--mix`), as llama-quantize's `--tensor-type`.

use super::Planned;
use super::rules::{self, TensorDesc};
use anyhow::{Context, Result, bail};
use mica_formats::ggml_types::GgmlType;
use mica_kernels::DType;
use regex::Regex;

/// One `REGEX=TYPE` rule.
pub struct Override {
    pattern: Regex,
    text: String,
    ty: DType,
}

/// Parses the `--tensor-type` arguments.
pub fn parse(args: &[String]) -> Result<Vec<Override>> {
    args.iter()
        .map(|a| {
            let Some((pat, ty)) = a.rsplit_once('=') else {
                bail!("--tensor-type '{a}': expected REGEX=TYPE, e.g. 'attn_v=q8_0'");
            };
            let pattern = Regex::new(pat)
                .with_context(|| format!("--tensor-type '{a}': bad regular expression"))?;
            let ty = DType::from_name(ty)
                .filter(|t| !matches!(t, DType::Q8_1 | DType::Q8_K))
                .with_context(|| {
                    format!(
                        "--tensor-type '{a}': unknown type '{ty}' (one of: f32, f16, bf16, q8_0, \
                         q6_k, q5_k, q5_1, q5_0, q4_k, q4_1, q4_0, q3_k, q2_k)"
                    )
                })?;
            Ok(Override {
                pattern,
                text: pat.to_string(),
                ty,
            })
        })
        .collect()
}

/// Applies the rules to the quantizable tensors of `planned` (those the llama.cpp rules would
/// quantize: matrices, not norms) and returns the indices of the tensors they set. A rule
/// that matches no tensor, or a type whose block does not divide a matched tensor's rows,
/// is an error.
pub fn apply(rules_: &[Override], planned: &mut [Planned]) -> Result<Vec<usize>> {
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
            bail!(
                "--tensor-type '{}={}': tensor '{}' has rows of {row}, not a multiple of {}'s \
                 block of {}",
                o.text,
                o.ty.name().to_ascii_lowercase(),
                p.info.name,
                o.ty.name(),
                o.ty.block_size()
            );
        }
        p.target = GgmlType(o.ty.ggml_id());
        set.push(i);
    }
    if let Some(k) = used.iter().position(|u| !u) {
        bail!(
            "--tensor-type '{}': the pattern matches no quantizable tensor of the source",
            rules_[k].text
        );
    }
    Ok(set)
}
