//! Compiling constraints for one model: a [`GrammarCompiler`] holds llguidance's parser
//! factory over the model's vocabulary (built once per model: indexing a 150k-token
//! vocabulary takes a while), and turns each [`Constraint`] into a [`CompiledGrammar`] —
//! checked before anything is generated, with the mask of the first token already computed,
//! so that an invalid or unsupported constraint is an error up front and never
//! unconstrained output.

use crate::constraint::{Constraint, ConstraintKind};
use crate::error::{GrammarError, Result};
use crate::processor::{GrammarProcessor, ProcessorOptions};
use crate::vocab::Vocabulary;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use mica_engine::{LogitsProcessor, ProcessorFactory};
use mica_models::LoadedModel;
use mica_models::tokenizer::Tokenizer;
use std::sync::Arc;
use toktrie::{SimpleVob, TokEnv};

/// Compiles constraints against one model's vocabulary. Cheap to clone (shared).
#[derive(Clone)]
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("n_vocab", &self.n_vocab())
            .finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// A compiler for a model with this tokenizer and `n_vocab` logits.
    pub fn new(tokenizer: &Tokenizer, n_vocab: usize) -> Result<GrammarCompiler> {
        let env: TokEnv = Vocabulary::new(tokenizer, n_vocab)?.into_env();
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        // A library prints nothing: llguidance's warnings would go to stderr.
        factory.quiet();
        Ok(GrammarCompiler {
            factory: Arc::new(factory),
        })
    }

    /// A compiler for a loaded model.
    pub fn for_model(model: &LoadedModel) -> Result<GrammarCompiler> {
        Self::new(&model.tokenizer, model.model.config.n_vocab)
    }

    /// Width of the masks (the model's logits).
    pub fn n_vocab(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }

    /// Whether the vocabulary has a control token with this text (a Lark grammar can name
    /// it as `<text>`).
    pub fn has_special_token(&self, text: &str) -> bool {
        self.factory
            .tok_env()
            .tok_trie()
            .get_special_token(text)
            .is_some()
    }

    /// Compiles `constraint`: an error when it is invalid or uses what llguidance does not
    /// support.
    pub fn compile(&self, constraint: &Constraint) -> Result<CompiledGrammar> {
        let grammar = constraint.to_grammar()?;
        self.compile_grammar(grammar, constraint.kind())
    }

    /// Compiles an llguidance grammar built elsewhere in the crate (tool calls).
    pub(crate) fn compile_grammar(
        &self,
        grammar: TopLevelGrammar,
        kind: ConstraintKind,
    ) -> Result<CompiledGrammar> {
        let fail = |message: String| GrammarError::Compile { kind, message };
        // llguidance's options (forcing off among them) are declared in Lark text.
        let forcing = !grammar.grammars.iter().any(|g| {
            g.lark_grammar
                .as_deref()
                .is_some_and(|l| l.contains("%llguidance"))
        });
        let mut matcher = Matcher::new(self.factory.create_parser(grammar));
        if let Some(e) = matcher.get_error() {
            return Err(fail(e));
        }
        // The first mask: errors some grammars only show when first used (a lexer or
        // parser over its limits) surface here, and the first token need not wait for it.
        let first_mask = matcher.compute_mask().map_err(|e| fail(e.to_string()))?;
        if first_mask.is_zero() {
            return Err(fail("the constraint allows no output at all".into()));
        }
        Ok(CompiledGrammar {
            inner: Arc::new(Compiled {
                matcher,
                first_mask,
                kind,
                forcing,
            }),
        })
    }
}

struct Compiled {
    /// At the start of the output, never advanced (each processor gets a clone).
    matcher: Matcher,
    first_mask: SimpleVob,
    kind: ConstraintKind,
    /// Whether the grammar keeps llguidance's forcing on (it declares no options).
    forcing: bool,
}

/// A checked constraint, ready to constrain any number of sequences. Cheap to clone.
#[derive(Clone)]
pub struct CompiledGrammar {
    inner: Arc<Compiled>,
}

impl std::fmt::Debug for CompiledGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledGrammar")
            .field("kind", &self.inner.kind)
            .finish_non_exhaustive()
    }
}

impl CompiledGrammar {
    pub fn kind(&self) -> ConstraintKind {
        self.inner.kind
    }

    /// A logits processor constraining one sequence from its first generated token, with
    /// the next mask computed in the background while the forward pass runs.
    pub fn processor(&self) -> GrammarProcessor {
        self.processor_with(ProcessorOptions::default())
    }

    /// [`CompiledGrammar::processor`] with options.
    pub fn processor_with(&self, opts: ProcessorOptions) -> GrammarProcessor {
        GrammarProcessor::new(
            self.inner.matcher.clone(),
            Some(self.inner.first_mask.clone()),
            opts,
            self.inner.forcing,
        )
    }

    /// The engine's per-completion processor factory: each completion of a request gets
    /// its own processor.
    pub fn factory(&self) -> ProcessorFactory {
        let g = self.clone();
        Box::new(move |_| vec![Box::new(g.processor()) as Box<dyn LogitsProcessor>])
    }

    /// Whether `text` is a complete output under this constraint (its bytes, however
    /// tokenized). For tests and validation; generation uses the processors.
    pub fn matches(&self, text: &str) -> bool {
        let mut m = self.inner.matcher.clone();
        let Ok(env) = m.tok_env() else {
            return false;
        };
        let tokens = env.tok_trie().greedy_tokenize(text.as_bytes());
        match m.try_consume_tokens(&tokens) {
            Ok(n) if n == tokens.len() => m.is_accepting().unwrap_or(false),
            _ => false,
        }
    }
}
