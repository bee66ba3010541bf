//! How DeepSeek's routers choose experts, from `config.json` or GGUF keys.

use crate::config::GgufKeys as Keys;
use crate::error::Result;
use crate::hf::HfFolder;
use crate::model::{GroupScore, Groups, Routing, Scoring};

/// Checks a grouping: `n_group` divides the experts, at most `n_group` groups searched,
/// and they hold at least `top_k` experts.
fn groups(
    n_expert: usize,
    top_k: usize,
    (n_group, topk_group): (usize, usize),
    score: GroupScore,
) -> std::result::Result<Option<Groups>, String> {
    if n_group <= 1 {
        return Ok(None);
    }
    if !n_expert.is_multiple_of(n_group) || topk_group == 0 || topk_group > n_group {
        return Err(format!(
            "{n_expert} experts in {n_group} groups, {topk_group} searched: the groups must \
             divide the experts and between 1 and all of them be searched"
        ));
    }
    if topk_group * (n_expert / n_group) < top_k {
        return Err(format!(
            "{topk_group} groups of {} experts hold fewer than the {top_k} chosen",
            n_expert / n_group
        ));
    }
    Ok(Some(Groups {
        n_group,
        topk_group,
        score,
    }))
}

/// `config.json`: V2's `scoring_func` (softmax) and `topk_method` (`greedy`, or
/// `group_limited_greedy`: groups ranked by their best expert); V3's sigmoid scores with
/// `e_score_correction_bias` and groups ranked by their best two; `n_group`, `topk_group`,
/// `routed_scaling_factor`.
pub(super) fn hf(hf: &HfFolder, v3: bool, n_expert: usize, top_k: usize) -> Result<Routing> {
    let c = &hf.config;
    let scoring = match (v3, c.scoring_func.as_deref()) {
        (true, _) | (false, Some("sigmoid")) => Scoring::Sigmoid,
        (false, None | Some("softmax")) => Scoring::Softmax,
        (false, Some(other)) => {
            return Err(hf.field_err(
                "scoring_func",
                format!("'{other}' is not supported (softmax, sigmoid are)"),
            ));
        }
    };
    let score = match (v3, c.topk_method.as_deref()) {
        (true, _) | (false, Some("noaux_tc")) => Some(GroupScore::TopTwoSum),
        (false, Some("group_limited_greedy")) => Some(GroupScore::Max),
        (false, None | Some("greedy")) => None,
        (false, Some(other)) => {
            return Err(hf.field_err(
                "topk_method",
                format!(
                    "'{other}' is not supported (greedy, group_limited_greedy, noaux_tc are)"
                ),
            ));
        }
    };
    let grouping = (c.n_group.unwrap_or(1), c.topk_group.unwrap_or(1));
    let groups = match score {
        Some(s) if n_expert > 0 => {
            groups(n_expert, top_k, grouping, s).map_err(|m| hf.field_err("n_group", m))?
        }
        _ => None,
    };
    let scale = c.routed_scaling_factor.unwrap_or(1.0) as f32;
    if !(scale.is_finite() && scale > 0.0) {
        return Err(hf.field_err("routed_scaling_factor", format!("{scale} is not positive")));
    }
    Ok(Routing {
        scoring,
        choice_bias: None,
        groups,
        scale,
    })
}

/// GGUF keys: `expert_gating_func` (1 softmax, 2 sigmoid), `expert_group_count` /
/// `expert_group_used_count` (groups ranked by their best two, as llama.cpp does),
/// `expert_weights_scale`.
pub(super) fn gguf(k: &Keys, n_expert: usize, top_k: usize) -> Result<Routing> {
    let key = |s: &str| format!("{}.{s}", k.arch);
    let scoring = match k.gguf.get_u64(&key("expert_gating_func")).unwrap_or(1) {
        1 => Scoring::Softmax,
        2 => Scoring::Sigmoid,
        g => {
            return Err(k.err(
                &key("expert_gating_func"),
                format!("{g} is not supported (1, softmax, and 2, sigmoid, are)"),
            ));
        }
    };
    let grouping = (
        k.usize_opt("expert_group_count")?.unwrap_or(1),
        k.usize_opt("expert_group_used_count")?.unwrap_or(1),
    );
    let groups = match n_expert {
        0 => None,
        _ => groups(n_expert, top_k, grouping, GroupScore::TopTwoSum)
            .map_err(|m| k.err(&key("expert_group_count"), m))?,
    };
    let scale = k.f32_opt("expert_weights_scale")?.unwrap_or(1.0);
    if scale <= 0.0 {
        return Err(k.err(&key("expert_weights_scale"), format!("{scale} is not positive")));
    }
    Ok(Routing {
        scoring,
        choice_bias: None,
        groups,
        scale,
    })
}
