//! Greedy choice's one-token check (`LogitsProcessor::keeps_top`): a grammar asked whether
//! it allows the highest-scoring token answers yes only where its mask allows that token,
//! at every position of walks through JSON Schema, regex, Lark, GBNF, choice and tool
//! grammars on both test models' vocabularies (forced keys and punctuation included); and
//! greedy outputs with the check are token for token those of whole masks, with and without
//! drafts, while most positions compute no mask.

mod common;
use common::*;
use mica_engine::{GenerateParams, Hooks, LogitsProcessor, Proposer, SamplingParams, Session};
use mica_grammar::tools::{Tool, ToolChoice, ToolSet};
use mica_grammar::{CompiledGrammar, Constraint, GrammarCompiler, ProcessorOptions};
use mica_models::LoadedModel;
use mica_models::chat::ChatMessage;
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;

const WHOLE_MASKS: ProcessorOptions = ProcessorOptions {
    background: false,
    greedy_check: false,
};

fn constraints(m: &LoadedModel, g: &GrammarCompiler) -> Vec<(&'static str, CompiledGrammar)> {
    let person = json!({"type": "object", "properties": {
        "the_name_of_the_person": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "goldfish"]}, "maxItems": 3},
        "score": {"type": "number"}, "ok": {"type": "boolean"}},
        "required": ["the_name_of_the_person", "age", "pets", "score", "ok"],
        "additionalProperties": false});
    let fruits = json!({"type": "object", "properties": {"fruits": {
        "type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 3}},
        "required": ["fruits"]});
    let format =
        mica_grammar::tools::ToolFormat::detect(m.tokenizer.chat_template().unwrap_or_default());
    let tools = ToolSet::new(
        vec![
            Tool::from_openai(&json!({"type": "function", "function": {
                "name": "get_weather", "parameters": {"type": "object", "properties": {
                    "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                    "required": ["city"]}}}))
            .unwrap(),
        ],
        format,
    )
    .unwrap();
    let mut out = vec![
        (
            "person",
            g.compile(&Constraint::JsonSchema(person)).unwrap(),
        ),
        (
            "fruits",
            g.compile(&Constraint::JsonSchema(fruits)).unwrap(),
        ),
        ("object", g.compile(&Constraint::JsonObject).unwrap()),
        (
            "regex",
            g.compile(&Constraint::Regex(
                r"(\(\d{3}\) \d{3}-\d{4}|[a-z ]{2,30}\.)".into(),
            ))
            .unwrap(),
        ),
        (
            "lark",
            g.compile(&Constraint::Lark(
                "start: \"Answer: \" NUM (\" and \" NUM)*\nNUM: /[0-9]{1,3}/\n".into(),
            ))
            .unwrap(),
        ),
        (
            "gbnf",
            g.compile(&Constraint::Gbnf(
                "root ::= \"<\" [a-z]+ (\" \" [a-z]+)* \">\"\n".into(),
            ))
            .unwrap(),
        ),
        (
            "choice",
            g.compile(&Constraint::Choice(vec![
                "yes".into(),
                "no".into(),
                "yes, and more".into(),
            ]))
            .unwrap(),
        ),
    ];
    let cg = tools.compile(g, &ToolChoice::Required).unwrap().unwrap();
    out.push(("tools", cg));
    out
}

/// A small deterministic generator (the walks must be the same on every run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// Walks random allowed paths through each grammar: at every position the check is asked
/// about every allowed token (up to a sample) and as many refused ones, and must never say
/// yes to a token the whole mask refuses.
#[test]
fn the_check_allows_only_what_the_mask_allows() {
    for name in [SMOLLM, QWEN] {
        let (m, g) = model(name);
        let n_vocab = m.model.config.n_vocab;
        let mut rng = Lcg(7);
        for (what, cg) in constraints(&m, &g) {
            let (mut yes, mut allowed_total) = (0usize, 0usize);
            for walk in 0..3 {
                let mut full = cg.processor_with(WHOLE_MASKS);
                let mut check = cg.processor_with(ProcessorOptions::default());
                for pos in 0..48 {
                    if full.is_complete() {
                        break;
                    }
                    let mut logits = vec![0.0f32; n_vocab];
                    full.process(&[], &mut logits);
                    let allowed: Vec<u32> = (0..n_vocab as u32)
                        .filter(|&t| logits[t as usize] == 0.0)
                        .collect();
                    assert!(!allowed.is_empty(), "{name} {what}: nothing allowed");
                    let mut asked: Vec<u32> = allowed
                        .iter()
                        .step_by(allowed.len() / 64 + 1)
                        .copied()
                        .collect();
                    for _ in 0..64 {
                        asked.push((rng.next() % n_vocab as u64) as u32);
                    }
                    // Past the trie's vocabulary (a model may have padding rows).
                    asked.push(n_vocab as u32 - 1);
                    for &t in &asked {
                        let ok = logits[t as usize] == 0.0;
                        let said = check.keeps_top(t);
                        assert!(
                            !said || ok,
                            "{name} {what} walk {walk} pos {pos}: the check allows token {t} \
                             ({:?}) that the mask refuses",
                            m.tokenizer.token_text(t)
                        );
                        yes += said as usize;
                        allowed_total += ok as usize;
                    }
                    // Mostly the grammar's likeliest continuations: the first allowed token
                    // (forced keys, punctuation), else a random allowed one.
                    let t = if rng.next().is_multiple_of(2) {
                        allowed[0]
                    } else {
                        allowed[(rng.next() % allowed.len() as u64) as usize]
                    };
                    assert!(full.accept(t) && check.accept(t), "{name} {what}: {t}");
                }
            }
            assert!(
                yes * 2 >= allowed_total / 2,
                "{name} {what}: the check said yes to {yes} of {allowed_total} allowed tokens"
            );
        }
    }
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: SamplingParams::greedy(),
        ..Default::default()
    }
}

/// Drafts the next few tokens of a known continuation, every third one wrong.
struct Known {
    prompt_len: usize,
    continuation: Vec<u32>,
}

impl Proposer for Known {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        let done = history.len() - self.prompt_len;
        (0..max.min(3))
            .map(|i| match self.continuation.get(done + i) {
                Some(&t) if i != 2 => t,
                _ => 1,
            })
            .collect()
    }
}

#[test]
fn greedy_outputs_are_those_of_whole_masks() {
    let prompts = [
        ("person", "Describe a person as JSON."),
        ("fruits", "List some fruits as JSON."),
        ("object", "Give me a JSON object about Paris."),
        ("regex", "A phone number or a short sentence."),
        ("lark", "What is 12 times 3, and 7 plus 8?"),
        ("gbnf", "Name three animals in angle brackets."),
        ("choice", "Is water wet?"),
        ("tools", "What's the weather in Oslo?"),
    ];
    for name in [SMOLLM, QWEN] {
        let (m, g) = model(name);
        let (mut checks, mut kept) = (0, 0);
        for (what, cg) in constraints(&m, &g) {
            let text = prompts.iter().find(|p| p.0 == what).unwrap().1;
            let p = m.chat_prompt(&[ChatMessage::new("user", text)]).unwrap();
            let run = |opts: ProcessorOptions, proposer: Option<&mut dyn Proposer>| {
                let proc = cg.processor_with(opts);
                let stats = proc.stats();
                let mut s = Session::new(&*m, 1024, threads());
                let hooks = Hooks {
                    processors: vec![Box::new(proc) as Box<dyn LogitsProcessor>],
                    proposer,
                };
                (
                    s.generate_with(&p, &greedy(48), hooks, |_| true).unwrap(),
                    stats,
                )
            };
            let (whole, _) = run(WHOLE_MASKS, None);
            let (fast, stats) = run(ProcessorOptions::default(), None);
            assert_eq!(
                fast.output_ids, whole.output_ids,
                "{name} {what}: {:?}",
                whole.text
            );
            assert_eq!(fast.finish, whole.finish, "{name} {what}");
            checks += stats.checks.load(Relaxed);
            kept += stats.checks_kept.load(Relaxed);
            let mut known = Known {
                prompt_len: p.len(),
                continuation: whole.output_ids.clone(),
            };
            let (drafted, _) = run(ProcessorOptions::default(), Some(&mut known));
            assert_eq!(
                drafted.output_ids, whole.output_ids,
                "{name} {what} drafted"
            );
        }
        assert!(
            kept * 2 > checks && checks > 50,
            "{name}: {kept} of {checks} checks kept the top token"
        );
    }
}
