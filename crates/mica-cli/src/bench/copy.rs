//! `mica bench`'s speculative test (`--copy N`): greedy generation of N tokens after a fixed
//! input-grounded prompt (a Python function to return with one variable renamed, in the
//! model's chat template), timed without and with n-gram speculative decoding. Random token
//! ids (the `tg` test) never repeat, so n-gram lookup has nothing to copy there; this test
//! shows what it gives where the output repeats the input, and what it costs where it does
//! not (the same prompt, after the copy ends).
//!
//! Each repetition starts from an empty session; only the generation is timed (the prompt
//! pass is not), as the session reports it.

use anyhow::Result;
use mica::engine::spec::SpecConfig;
use mica::engine::{GenerateParams, Hooks, SamplingParams, Session};
use mica::models::LoadedModel;
use mica::models::chat::ChatMessage;

/// The prompt: a rename in a 30-line function.
const PROMPT: &str = r#"Rename the variable `total` to `revenue` everywhere in this Python function. Reply with the complete updated function only.

```python
def summarize_orders(orders, tax_rate, discount_codes):
    total = 0.0
    count = 0
    skipped = []
    by_customer = {}
    for order in orders:
        if order.get("status") == "cancelled":
            skipped.append(order["id"])
            continue
        subtotal = 0.0
        for item in order["items"]:
            subtotal += item["price"] * item["quantity"]
        code = order.get("discount_code")
        if code in discount_codes:
            subtotal -= subtotal * discount_codes[code]
        tax = subtotal * tax_rate
        total += subtotal + tax
        count += 1
        customer = order["customer"]
        by_customer[customer] = by_customer.get(customer, 0.0) + subtotal + tax
    average = total / count if count else 0.0
    return {
        "total": round(total, 2),
        "count": count,
        "average": round(average, 2),
        "skipped": skipped,
        "by_customer": by_customer,
    }
```"#;

/// One timed run's outcome.
pub struct CopyRun {
    pub gen_ns: u64,
    pub draft_tokens: usize,
    pub accepted_draft_tokens: usize,
}

/// The prompt's token ids for `lm` (its chat template, or the plain text without one).
pub fn prompt_ids(lm: &LoadedModel) -> Result<Vec<u32>> {
    match lm.chat_prompt(&[ChatMessage::new("user", PROMPT)]) {
        Ok(ids) => Ok(ids),
        Err(_) => Ok(lm.tokenizer.encode(PROMPT, true, false)?),
    }
}

/// Generates `n` tokens greedily after `prompt` (past end-of-generation tokens), with
/// n-gram speculation when `spec`.
pub fn run(
    lm: &LoadedModel,
    threads: usize,
    prompt: &[u32],
    n: usize,
    spec: bool,
) -> Result<CopyRun> {
    let mut session = Session::new(lm, prompt.len() + n + 1, threads);
    let params = GenerateParams {
        max_tokens: n,
        ignore_eos: true,
        sampling: SamplingParams::greedy(),
        ..Default::default()
    };
    let cfg = if spec {
        SpecConfig::ngram(16)
    } else {
        SpecConfig::default()
    };
    let mut proposer = cfg.proposer(lm, &session.shared_pool())?;
    let hooks = Hooks {
        processors: Vec::new(),
        proposer: proposer
            .as_deref_mut()
            .map(|p| p as &mut dyn mica::engine::Proposer),
    };
    let out = session.generate_with(prompt, &params, hooks, |_| true)?;
    let t = out.timings;
    Ok(CopyRun {
        gen_ns: t.gen_time.as_nanos() as u64,
        draft_tokens: t.draft_tokens,
        accepted_draft_tokens: t.accepted_draft_tokens,
    })
}
