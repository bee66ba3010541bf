//! The GBNF converter against llama.cpp: the grammars of llama.cpp's `grammars/` folder all
//! convert and compile, and match what they should; the passing and failing strings of
//! llama.cpp's grammar integration tests (fixtures/grammars/llama_cpp_cases.json) come out
//! the same; and greedy lexing never changes a grammar's language.

mod common;
use common::*;
use mica_grammar::{CompiledGrammar, Constraint, GrammarError};
use std::path::PathBuf;

fn fixture(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/grammars")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn compile(src: &str) -> CompiledGrammar {
    let (_, g) = model(SMOLLM);
    g.compile(&Constraint::Gbnf(src.to_string()))
        .unwrap_or_else(|e| panic!("{e}\n{src}"))
}

fn check(src: &str, passing: &[&str], failing: &[&str]) {
    let g = compile(src);
    for s in passing {
        assert!(g.matches(s), "should match {s:?}:\n{src}");
    }
    for s in failing {
        assert!(!g.matches(s), "should not match {s:?}:\n{src}");
    }
}

#[test]
fn llama_cpp_integration_cases() {
    let cases: serde_json::Value = serde_json::from_str(&fixture("llama_cpp_cases.json")).unwrap();
    let cases = cases["cases"].as_array().unwrap();
    assert!(cases.len() >= 4);
    for c in cases {
        let strs = |k: &str| -> Vec<String> {
            c[k].as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_string())
                .collect()
        };
        let (p, f) = (strs("passing"), strs("failing"));
        let p: Vec<&str> = p.iter().map(String::as_str).collect();
        let f: Vec<&str> = f.iter().map(String::as_str).collect();
        check(c["grammar"].as_str().unwrap(), &p, &f);
    }
}

#[test]
fn llama_cpp_example_grammars() {
    check(
        &fixture("json.gbnf"),
        &["{\"a\": [1, 2.5, \"x\\n\"], \"b\": {\"c\": null}}", "{}"],
        &["{\"a\": }", "[1]", "{\"a\": 01x}"],
    );
    check(
        &fixture("json_arr.gbnf"),
        &["[\n{\"a\": 1},\n\"b\"]"],
        &["[1]", "{}"],
    );
    check(
        &fixture("arithmetic.gbnf"),
        &["x+1=y\n", "(a*2)=b1\n", "12 = 3\nx=y\n"],
        &["x+=y\n", "=1\n", "x=y"],
    );
    check(
        &fixture("list.gbnf"),
        &["- item one\n- two\n"],
        &["- \n", "item\n"],
    );
    check(
        &fixture("chess.gbnf"),
        &["1. e4 e5\n2. Nf3 Nc6\n", "1. d4 d5\n2. c4 O-O\n"],
        &["1. e4\n", "1. e4 e5\n"],
    );
    check(
        &fixture("english.gbnf"),
        &["Hello world 123!"],
        &["héllo", " lead"],
    );
    check(&fixture("japanese.gbnf"), &["こんにちは 世界"], &["abc"]);
    check(
        &fixture("c.gbnf"),
        &["int main(){return 0;}", "float f(int x){y = x+1;}"],
        &["int main(){return 0;", "main(){}"],
    );
}

/// What greedy lexing would break: a character class that could eat the text after it.
#[test]
fn greedy_lexing_does_not_change_the_language() {
    check(
        "root ::= [a-z]+ \"x\"",
        &["abx", "ax", "xx"],
        &["ab", "abxy"],
    );
    check(
        "root ::= [a-z]* \"x\" | \"(\" root \")\"",
        &["(abx)", "((x))", "x"],
        &["(ab)", "(x"],
    );
    // ws may eat the newline the rule then needs (llama.cpp's arithmetic.gbnf pattern).
    check(
        "root ::= (item \"\\n\")+\nitem ::= [a-z]+ ws | \"(\" root \")\" ws\nws ::= [ \\n]*",
        &["ab\n", "ab \n\n", "(a\n)\n"],
        &["ab", "\n"],
    );
}

#[test]
fn invalid_grammars_fail_before_generating() {
    let (_, g) = model(SMOLLM);
    for (src, needle) in [
        ("root ::= foo", "undefined rule identifier 'foo'"),
        ("root ::= [a-z", "unexpected end of input"),
        ("rooot ::= \"a\"", "no 'root' rule"),
        ("root ::= \"a\" )", "expecting newline or end"),
    ] {
        match g.compile(&Constraint::Gbnf(src.into())) {
            Err(e @ GrammarError::Gbnf { .. }) => {
                assert!(e.to_string().contains(needle), "{src}: {e}")
            }
            other => panic!("{src}: {other:?}"),
        }
    }
}
