//! Constrained decoding on the real test models: every output of a JSON Schema, regex,
//! choice or tool constraint fits it; the finish reason says when the grammar completed
//! the output (`Constraint`) or the length limit cut it (`Length`); masks computed in the
//! background give exactly the tokens of masks computed inline; drafted tokens are
//! verified through the grammar with the same result as without drafts; and the serving
//! engine runs differently constrained requests side by side, each with the tokens a
//! single session gives.

mod common;
use common::*;
use mica_engine::{
    EngineConfig, EngineHandle, Event, EventSink, FinishReason, GenerateParams, Hooks,
    LogitsProcessor, Proposer, Request, SamplingParams, SchedulerConfig, Session,
};
use mica_grammar::tools::{Tool, ToolChoice, ToolSet};
use mica_grammar::{CompiledGrammar, Constraint, ConstraintKind, GrammarError, ProcessorOptions};
use mica_models::LoadedModel;
use mica_models::chat::ChatMessage;
use serde_json::{Value, json};
use std::sync::mpsc;

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: SamplingParams::greedy(),
        ..Default::default()
    }
}

fn prompt(m: &LoadedModel, text: &str) -> Vec<u32> {
    m.chat_prompt(&[ChatMessage::new("user", text)]).unwrap()
}

fn run(
    m: &LoadedModel,
    g: Option<&CompiledGrammar>,
    opts: ProcessorOptions,
    p: &[u32],
    params: &GenerateParams,
    proposer: Option<&mut dyn Proposer>,
) -> mica_engine::Generation {
    let mut s = Session::new(m, 1024, threads());
    let hooks = Hooks {
        processors: g
            .iter()
            .map(|g| Box::new(g.processor_with(opts)) as Box<dyn LogitsProcessor>)
            .collect(),
        proposer,
    };
    s.generate_with(p, params, hooks, |_| true).unwrap()
}

fn schema() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "minItems": 1, "maxItems": 3}},
        "required": ["name", "age", "pets"], "additionalProperties": false})
}

#[test]
fn json_schema_outputs_validate_on_both_models() {
    let validator = jsonschema::validator_for(&schema()).unwrap();
    for name in [SMOLLM, QWEN] {
        let (m, g) = model(name);
        let cg = g.compile(&Constraint::JsonSchema(schema())).unwrap();
        let p = prompt(&m, "Describe a person and their pets as JSON.");
        let out = run(
            &m,
            Some(&cg),
            ProcessorOptions::default(),
            &p,
            &greedy(64),
            None,
        );
        assert!(
            matches!(out.finish, FinishReason::Constraint | FinishReason::Eos),
            "{name}: {:?} {:?}",
            out.finish,
            out.text
        );
        let v: Value =
            serde_json::from_str(&out.text).unwrap_or_else(|e| panic!("{name}: {e}: {}", out.text));
        assert!(validator.is_valid(&v), "{name}: {v}");
        // Unconstrained, the same prompt is not JSON at all on these models.
        let free = run(&m, None, ProcessorOptions::default(), &p, &greedy(24), None);
        assert!(
            serde_json::from_str::<Value>(&free.text).is_err(),
            "{name}: {}",
            free.text
        );
    }
}

#[test]
fn background_masks_give_the_tokens_of_inline_masks() {
    let (m, g) = model(SMOLLM);
    let cg = g.compile(&Constraint::JsonSchema(schema())).unwrap();
    let p = prompt(&m, "A person as JSON, please.");
    let bg = run(
        &m,
        Some(&cg),
        ProcessorOptions {
            background: true,
            greedy_check: false,
        },
        &p,
        &greedy(40),
        None,
    );
    let inline = run(
        &m,
        Some(&cg),
        ProcessorOptions {
            background: false,
            greedy_check: false,
        },
        &p,
        &greedy(40),
        None,
    );
    assert_eq!(bg.output_ids, inline.output_ids);
    assert_eq!(bg.finish, inline.finish);
}

/// Proposes a known continuation with every other draft token wrong (and a token the
/// grammar cannot allow), so verification must accept, refuse and roll back through the
/// grammar.
struct Noisy {
    prompt_len: usize,
    continuation: Vec<u32>,
}

impl Proposer for Noisy {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        let done = history.len() - self.prompt_len;
        (0..max.min(4))
            .map(|i| match self.continuation.get(done + i) {
                Some(&t) if i % 2 == 0 => t,
                _ => 0,
            })
            .collect()
    }
}

#[test]
fn drafted_tokens_are_verified_through_the_grammar() {
    let (m, g) = model(SMOLLM);
    let cg = g.compile(&Constraint::JsonSchema(schema())).unwrap();
    let p = prompt(&m, "A person as JSON, please.");
    let plain = run(
        &m,
        Some(&cg),
        ProcessorOptions::default(),
        &p,
        &greedy(40),
        None,
    );
    let mut prop = Noisy {
        prompt_len: p.len(),
        continuation: plain.output_ids.clone(),
    };
    let drafted = run(
        &m,
        Some(&cg),
        ProcessorOptions::default(),
        &p,
        &greedy(40),
        Some(&mut prop),
    );
    assert_eq!(drafted.output_ids, plain.output_ids);
    assert!(drafted.timings.gen_passes < plain.timings.gen_passes);
}

/// Proposes the next `n` tokens of a known continuation.
struct Exact {
    prompt_len: usize,
    continuation: Vec<u32>,
    n: usize,
}

impl Proposer for Exact {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        let done = history.len() - self.prompt_len;
        let end = (done + max.min(self.n)).min(self.continuation.len());
        self.continuation[done.min(end)..end].to_vec()
    }
}

/// The masks after drafted tokens are computed on the helper thread while the step's
/// forward pass runs, and used when verification walks through the draft: with right
/// drafts, partly wrong ones and inline masks alike, the tokens are those of plain decoding.
#[test]
fn masks_along_a_draft_are_computed_ahead_and_change_nothing() {
    let (m, g) = model(SMOLLM);
    let cg = g.compile(&Constraint::JsonSchema(schema())).unwrap();
    let p = prompt(&m, "A person as JSON, please.");
    let plain = run(
        &m,
        Some(&cg),
        ProcessorOptions::default(),
        &p,
        &greedy(40),
        None,
    );
    let drafted = |background: bool, proposer: &mut dyn Proposer| {
        let proc = cg.processor_with(ProcessorOptions {
            background,
            greedy_check: false,
        });
        let stats = proc.stats();
        let mut s = Session::new(&*m, 1024, threads());
        let hooks = Hooks {
            processors: vec![Box::new(proc) as Box<dyn LogitsProcessor>],
            proposer: Some(proposer),
        };
        let out = s.generate_with(&p, &greedy(40), hooks, |_| true).unwrap();
        (out, stats)
    };
    let mut exact = Exact {
        prompt_len: p.len(),
        continuation: plain.output_ids.clone(),
        n: 4,
    };
    let (out, stats) = drafted(true, &mut exact);
    assert_eq!(out.output_ids, plain.output_ids);
    let ahead = stats.ahead.load(std::sync::atomic::Ordering::Relaxed);
    let used = stats.ahead_used.load(std::sync::atomic::Ordering::Relaxed);
    assert!(ahead > 0 && used > 0, "ahead {ahead}, used {used}");
    assert!(
        out.timings.gen_passes * 2 < plain.timings.gen_passes,
        "{} passes with right drafts vs {}",
        out.timings.gen_passes,
        plain.timings.gen_passes
    );
    let mut noisy = Noisy {
        prompt_len: p.len(),
        continuation: plain.output_ids.clone(),
    };
    let (out, stats) = drafted(true, &mut noisy);
    assert_eq!(out.output_ids, plain.output_ids);
    assert!(stats.ahead.load(std::sync::atomic::Ordering::Relaxed) > 0);
    exact.n = 4;
    let (out, stats) = drafted(false, &mut exact);
    assert_eq!(out.output_ids, plain.output_ids);
    assert_eq!(stats.ahead.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[test]
fn finish_reasons_tell_complete_from_cut() {
    let (m, g) = model(SMOLLM);
    let p = prompt(&m, "Answer yes or no: is the sky blue?");
    let cg = g
        .compile(&Constraint::Choice(vec![
            "yes".into(),
            "no".into(),
            "maybe not".into(),
        ]))
        .unwrap();
    let out = run(
        &m,
        Some(&cg),
        ProcessorOptions::default(),
        &p,
        &greedy(16),
        None,
    );
    assert!(
        ["yes", "no", "maybe not"].contains(&out.text.as_str()),
        "{}",
        out.text
    );
    assert_eq!(out.finish, FinishReason::Constraint);

    // Cut by the length limit: reported as Length, and the text is not a complete value.
    let cg = g.compile(&Constraint::JsonSchema(schema())).unwrap();
    let out = run(
        &m,
        Some(&cg),
        ProcessorOptions::default(),
        &p,
        &greedy(5),
        None,
    );
    assert_eq!(out.finish, FinishReason::Length);
    assert!(serde_json::from_str::<Value>(&out.text).is_err());
    assert!(!cg.matches(&out.text));
}

#[test]
fn regex_and_lark_outputs_match() {
    let (m, g) = model(QWEN);
    let p = prompt(&m, "Give me a US phone number.");
    let cg = g
        .compile(&Constraint::Regex(r"\(\d{3}\) \d{3}-\d{4}".into()))
        .unwrap();
    let out = run(
        &m,
        Some(&cg),
        ProcessorOptions::default(),
        &p,
        &greedy(24),
        None,
    );
    let re = regex::Regex::new(r"^\(\d{3}\) \d{3}-\d{4}$").unwrap();
    assert!(re.is_match(&out.text), "{}", out.text);
    assert_eq!(out.finish, FinishReason::Constraint);

    let lark = "start: \"Answer: \" NUM\nNUM: /[0-9]{1,3}/\n";
    let cg = g.compile(&Constraint::Lark(lark.into())).unwrap();
    let p = prompt(&m, "What is 12 times 3?");
    let out = run(
        &m,
        Some(&cg),
        ProcessorOptions::default(),
        &p,
        &greedy(12),
        None,
    );
    assert!(out.text.starts_with("Answer: "), "{}", out.text);
    assert!(cg.matches(&out.text), "{}", out.text);
}

#[test]
fn bad_constraints_fail_before_generating() {
    let (_, g) = model(SMOLLM);
    let cases: Vec<(Constraint, ConstraintKind, &str)> = vec![
        (
            Constraint::JsonSchema(json!({"type": "strnig"})),
            ConstraintKind::JsonSchema,
            "strnig",
        ),
        (
            Constraint::JsonSchema(json!({"type": "object", "dependentSchemas": {"a": {}}})),
            ConstraintKind::JsonSchema,
            "dependentSchemas",
        ),
        (
            Constraint::JsonSchema(json!([1, 2])),
            ConstraintKind::JsonSchema,
            "schema",
        ),
        (Constraint::Regex("[a-".into()), ConstraintKind::Regex, ""),
        (
            Constraint::Lark("start: foo".into()),
            ConstraintKind::Lark,
            "foo",
        ),
    ];
    for (c, kind, needle) in cases {
        match g.compile(&c) {
            Err(GrammarError::Compile { kind: k, message }) => {
                assert_eq!(k, kind, "{c:?}");
                assert!(message.contains(needle), "{c:?}: {message}");
            }
            other => panic!("{c:?}: {other:?}"),
        }
    }
    assert_eq!(
        g.compile(&Constraint::Choice(vec![])).unwrap_err(),
        GrammarError::EmptyChoice
    );
}

fn weather_tools(m: &LoadedModel) -> ToolSet {
    let tools = vec![
        Tool::from_openai(&json!({"type": "function", "function": {
            "name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"]}}}))
        .unwrap(),
        Tool::from_openai(&json!({"type": "function", "function": {
            "name": "get_time", "description": "Current time in a time zone",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                "required": ["zone"]}}}))
        .unwrap(),
    ];
    let format =
        mica_grammar::tools::ToolFormat::detect(m.tokenizer.chat_template().unwrap_or_default());
    ToolSet::new(tools, format).unwrap()
}

#[test]
fn forced_tool_calls_parse_and_validate() {
    let (m, g) = model(QWEN);
    let tools = weather_tools(&m);
    assert_eq!(tools.format(), mica_grammar::tools::ToolFormat::Hermes);
    let p = m
        .chat_prompt_with_tools(
            &[ChatMessage::new(
                "user",
                "What's the weather like in Paris?",
            )],
            Some(&tools.template_tools()),
        )
        .unwrap();
    for choice in [
        ToolChoice::Required,
        ToolChoice::Function("get_time".into()),
    ] {
        let cg = tools.compile(&g, &choice).unwrap().unwrap();
        let out = run(
            &m,
            Some(&cg),
            ProcessorOptions::default(),
            &p,
            &greedy(60),
            None,
        );
        let parsed = tools.parse(&out.text);
        assert!(!parsed.calls.is_empty(), "{choice:?}: {}", out.text);
        for c in &parsed.calls {
            tools.validate(c).unwrap();
            if let ToolChoice::Function(f) = &choice {
                assert_eq!(&c.name, f);
            }
        }
    }
    // Auto: the model decides, and its call (Qwen2.5 calls here) parses and validates.
    let out = run(&m, None, ProcessorOptions::default(), &p, &greedy(60), None);
    let parsed = tools.parse(&out.text);
    assert_eq!(parsed.calls.len(), 1, "{}", out.text);
    assert_eq!(parsed.calls[0].name, "get_weather");
}

struct Sink(mpsc::Sender<Event>);

impl EventSink for Sink {
    fn send(&mut self, event: Event) -> bool {
        self.0.send(event).is_ok()
    }
    fn is_closed(&self) -> bool {
        false
    }
}

#[test]
fn engine_batches_differently_constrained_requests() {
    engine_batch(false);
    engine_batch(true);
}

/// The constrained batch of the test above, each request with a proposer that drafts
/// nothing of its own (`speculate`: the grammar's forced tokens are then drafted) or none.
fn engine_batch(speculate: bool) {
    let (m, g) = model(SMOLLM);
    let cfg = EngineConfig {
        n_threads: threads(),
        n_ctx: 1024,
        kv_blocks: 256,
        scheduler: SchedulerConfig::default(),
        max_waiting_per_lane: 16,
        prefix_caching: true,
        max_n: 4,
        abandon_every: 0,
        state_checkpoints: 0,
        state_checkpoint_interval: 0,
    };
    let engine = EngineHandle::start(m.clone(), cfg).unwrap();
    let constraints = [
        Some(Constraint::JsonSchema(schema())),
        Some(Constraint::Choice(vec!["red".into(), "green".into()])),
        None,
        Some(Constraint::Regex("[A-Z][a-z]+ [0-9]{2}".into())),
    ];
    let p = prompt(&m, "Name a colour and a person.");
    let mut rxs = Vec::new();
    for c in &constraints {
        let (tx, rx) = mpsc::channel();
        let grammar = c.as_ref().map(|c| g.compile(c).unwrap());
        engine
            .submit(Request {
                prompt: p.clone(),
                params: greedy(40),
                lane: mica_engine::Lane::Interactive,
                n: 1,
                logprobs: None,
                sink: Box::new(Sink(tx)),
                processors: grammar.as_ref().map(CompiledGrammar::factory),
                proposer: speculate.then(|| Box::new(Silent) as Box<dyn Proposer>),
                lora: None,
            })
            .unwrap();
        rxs.push((grammar, rx));
    }
    for (grammar, rx) in rxs {
        let (mut ids, mut finish, mut accepted) = (Vec::new(), None, 0);
        for ev in rx {
            match ev {
                Event::Token { token, .. } => ids.push(token),
                Event::Done { finish: f, .. } => finish = Some(f),
                Event::Finished { usage } => {
                    accepted = usage.accepted_draft_tokens;
                    break;
                }
                Event::Error(e) => panic!("{e}"),
            }
        }
        let single = run(
            &m,
            grammar.as_ref(),
            ProcessorOptions::default(),
            &p,
            &greedy(40),
            None,
        );
        assert_eq!(ids, single.output_ids, "speculate {speculate}");
        assert_eq!(finish, Some(single.finish));
        // The JSON schema's keys are forced: drafted and accepted when speculating.
        if grammar.as_ref().map(CompiledGrammar::kind) == Some(ConstraintKind::JsonSchema) {
            assert_eq!(accepted > 0, speculate, "{accepted} forced tokens accepted");
        }
        if let Some(g) = &grammar
            && single.finish != FinishReason::Length
        {
            assert!(g.matches(&single.text), "{}", single.text);
        }
    }
}

/// Proposes nothing: every draft then comes from the grammar's forced tokens.
struct Silent;

impl Proposer for Silent {
    fn propose(&mut self, _history: &[u32], _max: usize) -> Vec<u32> {
        Vec::new()
    }
}

/// With speculation on, the tokens a grammar forces (fixed keys, punctuation) are drafted:
/// the output is plain decoding's, in fewer passes, on both models.
#[test]
fn forced_tokens_are_drafted() {
    let long_keys = json!({"type": "object", "properties": {
        "the_name_of_the_person_described": {"type": "string", "maxLength": 12},
        "the_age_of_the_person_in_whole_years": {"type": "integer", "minimum": 0, "maximum": 120},
        "whether_the_person_owns_a_bicycle": {"type": "boolean"}},
        "required": ["the_name_of_the_person_described", "the_age_of_the_person_in_whole_years",
                     "whether_the_person_owns_a_bicycle"],
        "additionalProperties": false});
    for name in [SMOLLM, QWEN] {
        let (m, g) = model(name);
        let cg = g
            .compile(&Constraint::JsonSchema(long_keys.clone()))
            .unwrap();
        let p = prompt(&m, "Describe a person as JSON.");
        let opts = ProcessorOptions::default();
        let plain = run(&m, Some(&cg), opts, &p, &greedy(80), None);
        let drafted = run(&m, Some(&cg), opts, &p, &greedy(80), Some(&mut Silent));
        assert_eq!(drafted.output_ids, plain.output_ids, "{name}");
        assert_eq!(drafted.finish, plain.finish, "{name}");
        let t = &drafted.timings;
        assert!(
            t.accepted_draft_tokens >= 20 && t.gen_passes + 20 <= plain.timings.gen_passes,
            "{name}: {} of {} forced drafts accepted, {} passes vs {}",
            t.accepted_draft_tokens,
            t.draft_tokens,
            t.gen_passes,
            plain.timings.gen_passes
        );
        let inline = ProcessorOptions {
            background: false,
            greedy_check: false,
        };
        let drafted_inline = run(&m, Some(&cg), inline, &p, &greedy(80), Some(&mut Silent));
        assert_eq!(drafted_inline.output_ids, plain.output_ids, "{name}");
    }
}
