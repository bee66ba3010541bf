//! llama.cpp's GBNF grammars, converted to llguidance's Lark dialect.
//!
//! llguidance reads Lark, not GBNF, and ships no GBNF converter in its Rust crate (its
//! Python package has a script), so the conversion is here. The parser follows llama.cpp's
//! grammar parser (`src/llama-grammar.cpp`) rule for rule — the same syntax, escapes,
//! newline rules, and errors for what it refuses (an undefined rule, no `root`, an unknown
//! escape, a repetition with nothing before it) — so a grammar means here what it means
//! there.
//!
//! **Keeping llama.cpp's meaning.** GBNF is matched character by character, with no lexer;
//! llguidance splits its input into lexemes first, and a lexeme ends only where the next
//! byte cannot extend it (greedy lexing). Emitting GBNF rules as Lark terminals naively
//! would change the language: `root ::= [a-z]+ "x"` would lex `abx` as one `[a-z]+`
//! lexeme and never find the `x`. The conversion avoids that in two ways:
//! - a grammar with no recursion is a regular language: every rule becomes a Lark
//!   *terminal*, so the whole output is one lexeme (one regular expression), matched
//!   exactly, and fast;
//! - a recursive grammar becomes Lark *rules* over single-character lexemes (each character
//!   class, each character of a literal): a one-character lexeme can never be extended, so
//!   lexing cannot cut differently than GBNF does, and llguidance's Earley parser then
//!   parses exactly GBNF's context-free language (slower masks than a hand-written Lark
//!   grammar with real terminals: use Lark for speed).
//!
//! Empty alternatives (`ws ::= | " "`) become optional groups, since Lark has no empty
//! lexeme.

use crate::error::{GrammarError, Result};
use std::collections::HashMap;
use std::fmt::Write;

/// Most repetitions `{m,n}` may ask for (llama.cpp's `MAX_REPETITION_THRESHOLD`).
const MAX_REPETITION: u32 = 2000;

/// Whether `text` looks like GBNF (defines a rule with `::=`) rather than Lark.
pub fn looks_like_gbnf(text: &str) -> bool {
    text.lines().any(|l| {
        let l = l.trim_start();
        let name_end = l
            .find(|c: char| !Parser::is_word_char(c))
            .unwrap_or(l.len());
        name_end > 0 && l[name_end..].trim_start().starts_with("::=")
    })
}

/// One element of a sequence.
#[derive(Clone, Debug, PartialEq)]
enum Item {
    /// A literal string (possibly empty), as characters.
    Literal(Vec<char>),
    /// `[...]` or `[^...]`: inclusive character ranges.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    /// `.`: any character.
    Any,
    /// A rule, by index.
    Ref(usize),
    /// `( ... )`: alternatives.
    Group(Vec<Vec<Item>>),
    /// The item before `*`, `+`, `?` or `{m,n}` (`max` None: unbounded).
    Repeat(Box<Item>, u32, Option<u32>),
}

/// A parsed grammar: rules by index (names in `names`), each a list of alternatives.
#[derive(Debug)]
pub(crate) struct Grammar {
    names: Vec<String>,
    rules: Vec<Option<Vec<Vec<Item>>>>,
    root: usize,
}

/// Converts a GBNF grammar to llguidance Lark (module docs).
pub fn to_lark(src: &str) -> Result<String> {
    let g = Parser::new(src).parse()?;
    Ok(g.emit())
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
    names: Vec<String>,
    ids: HashMap<String, usize>,
    rules: Vec<Option<Vec<Vec<Item>>>>,
    /// Where each rule was first referenced, for "undefined rule" errors.
    first_ref: Vec<usize>,
}

impl<'a> Parser<'a> {
    fn new(src: &'a str) -> Parser<'a> {
        Parser {
            src,
            pos: 0,
            names: Vec::new(),
            ids: HashMap::new(),
            rules: Vec::new(),
            first_ref: Vec::new(),
        }
    }

    fn err(&self, at: usize, message: impl Into<String>) -> GrammarError {
        let before = &self.src[..at.min(self.src.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        GrammarError::Gbnf {
            line,
            column,
            message: message.into(),
        }
    }

    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn peek_at(&self, n: usize) -> Option<char> {
        self.src[self.pos..].chars().nth(n)
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    /// Spaces, tabs and `#` comments; newlines too when `newline_ok` (llama.cpp's
    /// `parse_space`).
    fn space(&mut self, newline_ok: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => {
                    self.bump();
                }
                '#' => {
                    while let Some(c) = self.peek() {
                        if c == '\r' || c == '\n' {
                            break;
                        }
                        self.bump();
                    }
                }
                '\r' | '\n' if newline_ok => {
                    self.bump();
                }
                _ => break,
            }
        }
    }

    fn symbol(&mut self, name: &str) -> usize {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len();
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), id);
        self.rules.push(None);
        self.first_ref.push(self.pos);
        id
    }

    fn is_word_char(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '-'
    }

    fn name(&mut self) -> Result<String> {
        let start = self.pos;
        while self.peek().is_some_and(Self::is_word_char) {
            self.bump();
        }
        if self.pos == start {
            return Err(self.err(start, "expecting name"));
        }
        Ok(self.src[start..self.pos].to_string())
    }

    fn hex(&mut self, digits: usize) -> Result<char> {
        let start = self.pos;
        let mut v: u32 = 0;
        for _ in 0..digits {
            let Some(d) = self.peek().and_then(|c| c.to_digit(16)) else {
                return Err(self.err(start, format!("expecting {digits} hex chars")));
            };
            self.bump();
            v = v * 16 + d;
        }
        char::from_u32(v).ok_or_else(|| self.err(start, format!("invalid character U+{v:X}")))
    }

    /// One possibly escaped character (llama.cpp's `parse_char`).
    fn char(&mut self) -> Result<char> {
        let at = self.pos;
        match self.bump() {
            None => Err(self.err(at, "unexpected end of input")),
            Some('\\') => match self.bump() {
                Some('x') => self.hex(2),
                Some('u') => self.hex(4),
                Some('U') => self.hex(8),
                Some('t') => Ok('\t'),
                Some('r') => Ok('\r'),
                Some('n') => Ok('\n'),
                Some(c @ ('\\' | '"' | '[' | ']')) => Ok(c),
                Some(c) => Err(self.err(at, format!("unknown escape at \\{c}"))),
                None => Err(self.err(at, "unexpected end of input")),
            },
            Some(c) => Ok(c),
        }
    }

    fn int(&mut self) -> Result<u32> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.bump();
        }
        self.src[start..self.pos]
            .parse()
            .map_err(|_| self.err(start, "expecting an int"))
    }

    /// A sequence of items up to `|`, `)` or the end of the rule (llama.cpp's
    /// `parse_sequence`).
    fn sequence(&mut self, nested: bool) -> Result<Vec<Item>> {
        let mut out: Vec<Item> = Vec::new();
        while let Some(c) = self.peek() {
            let at = self.pos;
            match c {
                '"' => {
                    self.bump();
                    let mut chars = Vec::new();
                    while self.peek() != Some('"') {
                        if self.peek().is_none() {
                            return Err(self.err(self.pos, "unexpected end of input"));
                        }
                        chars.push(self.char()?);
                    }
                    self.bump();
                    out.push(Item::Literal(chars));
                }
                '[' => {
                    self.bump();
                    let negated = self.peek() == Some('^');
                    if negated {
                        self.bump();
                    }
                    let mut ranges = Vec::new();
                    while self.peek() != Some(']') {
                        if self.peek().is_none() {
                            return Err(self.err(self.pos, "unexpected end of input"));
                        }
                        let lo = self.char()?;
                        let mut hi = lo;
                        if self.peek() == Some('-') && self.peek_at(1) != Some(']') {
                            if self.peek_at(1).is_none() {
                                return Err(self.err(self.pos, "unexpected end of input"));
                            }
                            self.bump();
                            hi = self.char()?;
                        }
                        ranges.push((lo, hi));
                    }
                    self.bump();
                    out.push(Item::Class { negated, ranges });
                }
                c if Self::is_word_char(c) => {
                    let name = self.name()?;
                    let id = self.symbol(&name);
                    out.push(Item::Ref(id));
                }
                '(' => {
                    self.bump();
                    self.space(true);
                    let alts = self.alternates(true)?;
                    if self.peek() != Some(')') {
                        return Err(self.err(self.pos, "expecting ')'"));
                    }
                    self.bump();
                    out.push(Item::Group(alts));
                }
                '.' => {
                    self.bump();
                    out.push(Item::Any);
                }
                '*' | '+' | '?' => {
                    self.bump();
                    let (min, max) = match c {
                        '*' => (0, None),
                        '+' => (1, None),
                        _ => (0, Some(1)),
                    };
                    self.repeat(&mut out, at, min, max)?;
                }
                '{' => {
                    self.bump();
                    self.space(nested);
                    if !self.peek().is_some_and(|c| c.is_ascii_digit()) {
                        return Err(self.err(self.pos, "expecting an int"));
                    }
                    let min = self.int()?;
                    self.space(nested);
                    let max = match self.peek() {
                        Some('}') => Some(min),
                        Some(',') => {
                            self.bump();
                            self.space(nested);
                            let max = if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                                Some(self.int()?)
                            } else {
                                None
                            };
                            self.space(nested);
                            max
                        }
                        _ => return Err(self.err(self.pos, "expecting ',' or '}'")),
                    };
                    if self.peek() != Some('}') {
                        return Err(self.err(self.pos, "expecting '}'"));
                    }
                    self.bump();
                    if max.is_some_and(|m| m < min) {
                        return Err(self.err(at, "the repetition's maximum is below its minimum"));
                    }
                    self.repeat(&mut out, at, min, max)?;
                }
                _ => break,
            }
            self.space(nested);
        }
        Ok(out)
    }

    fn repeat(&self, out: &mut [Item], at: usize, min: u32, max: Option<u32>) -> Result<()> {
        if min.max(max.unwrap_or(0)) > MAX_REPETITION {
            return Err(self.err(at, "number of repetitions exceeds sane defaults"));
        }
        let Some(last) = out.last_mut() else {
            return Err(self.err(at, "expecting preceding item to */+/?/{"));
        };
        let item = std::mem::replace(last, Item::Any);
        *last = Item::Repeat(Box::new(item), min, max);
        Ok(())
    }

    fn alternates(&mut self, nested: bool) -> Result<Vec<Vec<Item>>> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some('|') {
            self.bump();
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts)
    }

    fn rule(&mut self) -> Result<()> {
        let name = self.name()?;
        self.space(false);
        let id = self.symbol(&name);
        if !self.src[self.pos..].starts_with("::=") {
            return Err(self.err(self.pos, "expecting ::="));
        }
        self.pos += 3;
        self.space(true);
        let alts = self.alternates(false)?;
        match self.peek() {
            Some('\r') => {
                self.bump();
                if self.peek() == Some('\n') {
                    self.bump();
                }
            }
            Some('\n') => {
                self.bump();
            }
            None => {}
            Some(_) => return Err(self.err(self.pos, "expecting newline or end")),
        }
        // A later definition of the same name replaces the earlier one, as in llama.cpp.
        self.rules[id] = Some(alts);
        self.space(true);
        Ok(())
    }

    fn parse(mut self) -> Result<Grammar> {
        self.space(true);
        while self.peek().is_some() {
            self.rule()?;
        }
        for (id, rule) in self.rules.iter().enumerate() {
            if rule.is_none() {
                return Err(self.err(
                    self.first_ref[id],
                    format!("undefined rule identifier '{}'", self.names[id]),
                ));
            }
        }
        let Some(&root) = self.ids.get("root") else {
            return Err(self.err(0, "the grammar has no 'root' rule"));
        };
        Ok(Grammar {
            names: self.names,
            rules: self.rules,
            root,
        })
    }
}

impl Grammar {
    fn alts(&self, id: usize) -> &[Vec<Item>] {
        self.rules[id].as_deref().unwrap_or_default()
    }

    /// Rules reachable from `root`, in first-reached order.
    fn reachable(&self) -> Vec<usize> {
        let mut seen = vec![false; self.rules.len()];
        let mut order = Vec::new();
        let mut stack = vec![self.root];
        while let Some(id) = stack.pop() {
            if std::mem::replace(&mut seen[id], true) {
                continue;
            }
            order.push(id);
            let mut refs = Vec::new();
            for seq in self.alts(id) {
                for item in seq {
                    collect_refs(item, &mut refs);
                }
            }
            stack.extend(refs.into_iter().rev());
        }
        order
    }

    /// Whether any rule reachable from `root` refers back to itself.
    fn is_recursive(&self, reachable: &[usize]) -> bool {
        // Depth-first search for a back edge.
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            Open,
            Done,
        }
        fn visit(g: &Grammar, id: usize, marks: &mut [Mark]) -> bool {
            match marks[id] {
                Mark::Open => return true,
                Mark::Done => return false,
                Mark::New => {}
            }
            marks[id] = Mark::Open;
            let mut refs = Vec::new();
            for seq in g.alts(id) {
                for item in seq {
                    collect_refs(item, &mut refs);
                }
            }
            for r in refs {
                if visit(g, r, marks) {
                    return true;
                }
            }
            marks[id] = Mark::Done;
            false
        }
        let mut marks = vec![Mark::New; self.rules.len()];
        reachable.iter().any(|&id| visit(self, id, &mut marks))
    }

    /// Per rule: whether it can match a non-empty string (fixpoint).
    fn nonempty(&self) -> Vec<bool> {
        let mut ne = vec![false; self.rules.len()];
        loop {
            let mut changed = false;
            for id in 0..self.rules.len() {
                if !ne[id]
                    && self
                        .alts(id)
                        .iter()
                        .any(|s| s.iter().any(|i| item_nonempty(i, &ne)))
                {
                    ne[id] = true;
                    changed = true;
                }
            }
            if !changed {
                return ne;
            }
        }
    }

    /// The Lark text (module docs).
    fn emit(&self) -> String {
        let reachable = self.reachable();
        let recursive = self.is_recursive(&reachable);
        let ne = self.nonempty();
        let e = Emitter {
            g: self,
            ne: &ne,
            terminals: !recursive,
        };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "// converted from GBNF ({})",
            if recursive {
                "recursive: rules over single characters"
            } else {
                "regular: one terminal"
            }
        );
        let _ = writeln!(out, "start: {}", e.name(self.root));
        for &id in &reachable {
            let _ = writeln!(out, "{}: {}", e.name(id), e.alts(self.alts(id)));
        }
        out
    }
}

fn collect_refs(item: &Item, out: &mut Vec<usize>) {
    match item {
        Item::Ref(r) => out.push(*r),
        Item::Group(alts) => alts.iter().flatten().for_each(|i| collect_refs(i, out)),
        Item::Repeat(inner, ..) => collect_refs(inner, out),
        _ => {}
    }
}

fn item_nonempty(item: &Item, ne: &[bool]) -> bool {
    match item {
        Item::Literal(chars) => !chars.is_empty(),
        Item::Class { .. } | Item::Any => true,
        Item::Ref(r) => ne[*r],
        Item::Group(alts) => alts.iter().any(|s| s.iter().any(|i| item_nonempty(i, ne))),
        Item::Repeat(inner, _, max) => *max != Some(0) && item_nonempty(inner, ne),
    }
}

/// Writes rules as Lark terminals (regular grammars) or as rules over one-character
/// lexemes (recursive ones).
struct Emitter<'g> {
    g: &'g Grammar,
    ne: &'g [bool],
    terminals: bool,
}

impl Emitter<'_> {
    fn name(&self, id: usize) -> String {
        let base: String = self.g.names[id]
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        if self.terminals {
            format!("T{id}_{}", base.to_ascii_uppercase())
        } else {
            format!("r{id}_{}", base.to_ascii_lowercase())
        }
    }

    /// Alternatives joined by `|` (not parenthesized), and whether an empty alternative
    /// makes the whole choice optional. `None` when every alternative is empty.
    fn alts_opt(&self, alts: &[Vec<Item>]) -> Option<(String, bool)> {
        let mut parts: Vec<String> = Vec::new();
        let mut empty = false;
        for seq in alts {
            match self.seq(seq) {
                Some(s) => {
                    if !parts.contains(&s) {
                        parts.push(s)
                    }
                }
                None => empty = true,
            }
        }
        (!parts.is_empty()).then(|| (parts.join(" | "), empty))
    }

    /// A rule body: its alternatives (a rule that only matches the empty string never
    /// appears: references to it are dropped).
    fn alts(&self, alts: &[Vec<Item>]) -> String {
        match self.alts_opt(alts) {
            Some((body, true)) => format!("({body})?"),
            Some((body, false)) => body,
            None => "\"\"".to_string(),
        }
    }

    /// A sequence, or `None` when it can only match the empty string.
    fn seq(&self, seq: &[Item]) -> Option<String> {
        let parts: Vec<String> = seq.iter().filter_map(|i| self.item(i)).collect();
        (!parts.is_empty()).then(|| parts.join(" "))
    }

    fn item(&self, item: &Item) -> Option<String> {
        if !item_nonempty(item, self.ne) {
            return None;
        }
        Some(match item {
            Item::Literal(chars) => {
                if self.terminals {
                    regex_lexeme(&chars.iter().map(|&c| regex_char(c)).collect::<String>())
                } else {
                    let parts: Vec<String> = chars
                        .iter()
                        .map(|&c| regex_lexeme(&regex_char(c)))
                        .collect();
                    if parts.len() == 1 {
                        parts.into_iter().next().unwrap_or_default()
                    } else {
                        format!("({})", parts.join(" "))
                    }
                }
            }
            Item::Class { negated, ranges } => regex_lexeme(&class_regex(*negated, ranges)),
            Item::Any => regex_lexeme("(?s:.)"),
            Item::Ref(r) => self.name(*r),
            Item::Group(alts) => {
                let (body, optional) = self.alts_opt(alts)?;
                if optional {
                    format!("({body})?")
                } else {
                    format!("({body})")
                }
            }
            Item::Repeat(inner, min, max) => {
                let inner = self.item(inner)?;
                match (min, max) {
                    (0, None) => format!("({inner})*"),
                    (1, None) => format!("({inner})+"),
                    (0, Some(1)) => format!("({inner})?"),
                    (m, None) => format!("({inner}){{{m},}}"),
                    (m, Some(n)) if m == n => format!("({inner}){{{m}}}"),
                    (m, Some(n)) => format!("({inner}){{{m},{n}}}"),
                }
            }
        })
    }
}

/// `/regex/` as a Lark lexeme.
fn regex_lexeme(rx: &str) -> String {
    format!("/{rx}/")
}

/// One character in Rust regex syntax: ASCII letters and digits as they are, everything
/// else as a `\x{...}` escape (never a metacharacter, never a `/` ending the Lark regex).
fn regex_char(c: char) -> String {
    if c.is_ascii_alphanumeric() {
        c.to_string()
    } else {
        format!("\\x{{{:X}}}", c as u32)
    }
}

fn class_regex(negated: bool, ranges: &[(char, char)]) -> String {
    if ranges.is_empty() {
        // `[]` matches nothing and `[^]` any character, as in llama.cpp.
        return if negated {
            "(?s:.)".into()
        } else {
            "[^\\x{0}-\\x{10FFFF}]".into()
        };
    }
    let mut s = String::from("[");
    if negated {
        s.push('^');
    }
    for &(lo, hi) in ranges {
        s.push_str(&regex_char(lo));
        if hi != lo {
            s.push('-');
            s.push_str(&regex_char(hi));
        }
    }
    s.push(']');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(src: &str) -> String {
        to_lark(src).unwrap_err().to_string()
    }

    #[test]
    fn regular_grammars_become_one_terminal() {
        let lark = to_lark("root ::= [a-z]+ \"x\"\n").unwrap();
        assert!(lark.contains("start: T0_ROOT"), "{lark}");
        assert!(lark.contains("T0_ROOT: (/[a-z]/)+ /x/"), "{lark}");
    }

    #[test]
    fn recursive_grammars_become_character_rules() {
        let lark = to_lark("root ::= \"(\" root \")\" | \"ab\"").unwrap();
        assert!(lark.contains("start: r0_root"), "{lark}");
        assert!(lark.contains("(/a/ /b/)"), "{lark}");
    }

    #[test]
    fn empty_alternatives_make_optional_groups() {
        let lark = to_lark("root ::= \"a\" ws \"b\"\nws ::= | \" \" | \"\\n\"").unwrap();
        assert!(lark.contains("T1_WS: (/\\x{20}/ | /\\x{A}/)?"), "{lark}");
        // A group holding a sequence keeps its parentheses under a repetition.
        let lark = to_lark("root ::= \"a\" (\"+\" \"b\")*").unwrap();
        assert!(lark.contains("((/\\x{2B}/ /b/))*"), "{lark}");
    }

    #[test]
    fn errors_follow_llama_cpp() {
        assert!(err("root ::= foo").contains("undefined rule identifier 'foo'"));
        assert!(err("rot ::= \"a\"").contains("no 'root' rule"));
        assert!(err("root ::= \"a").contains("unexpected end of input"));
        assert!(err("root ::= \"\\q\"").contains("unknown escape"));
        assert!(err("root ::= * \"a\"").contains("expecting preceding item"));
        assert!(err("root := \"a\"").contains("expecting ::="));
        assert!(err("root ::= (\"a\"").contains("expecting ')'"));
        assert!(err("root ::= \"a\"{3,1}").contains("maximum is below"));
        assert!(err("root ::= \"a\"{5000}").contains("sane defaults"));
        assert!(err("root ::= [a-z\n").contains("unexpected end of input"));
        let e = to_lark("root ::= \"a\"\nx ::= \"b\" ]").unwrap_err();
        assert!(
            matches!(
                e,
                GrammarError::Gbnf {
                    line: 2,
                    column: 11,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn newlines_end_rules_outside_groups() {
        // A top-level sequence ends at a newline; inside parentheses it goes on.
        assert!(to_lark("root ::= \"a\"\n  \"b\"").is_err());
        assert!(to_lark("root ::= (\"a\"\n  \"b\")").is_ok());
        assert!(to_lark("root ::= \"a\" |\n  \"b\"").is_ok());
    }

    #[test]
    fn detects_gbnf() {
        assert!(looks_like_gbnf("# c\nroot ::= \"a\""));
        assert!(!looks_like_gbnf("start: \"a\" // x ::= y"));
    }
}
