//! The GBNF checker against what llama.cpp accepts and refuses, and against
//! hostile grammars: each limit, on a small stack.

use super::*;
use crate::testing::{doubling, nested_groups, on_small_stack, rule_chain};

fn error(grammar: &str) -> String {
    check(grammar).unwrap_err().to_string()
}

#[test]
fn llama_cpp_syntax_is_accepted() {
    check(
        r#"# a comment
root ::= greeting (" " name)? "!"{1,3} [\n]*
greeting ::= "hello" | "hi"   # trailing comment
name ::= [A-Z] [a-z\x41-\u005A]+ | . | ( "a"
| "b" )
space ::= | " "
"#,
    )
    .unwrap();
    check("root ::= [^\"\\\\] \"\\\"\"").unwrap();
    check("root ::= \"é\" [à-ÿ]").unwrap();
}

#[test]
fn problems_are_reported_with_their_line() {
    assert_eq!(
        error("root ::= a\n"),
        "grammar line 1: rule a is used but not defined"
    );
    assert_eq!(
        error("a ::= \"x\"\n"),
        "grammar line 1: the grammar has no root rule (generation starts at `root ::= ...`)"
    );
    assert_eq!(
        error("root ::= \"x\n"),
        "grammar line 1: a literal is not closed before the line ends"
    );
    assert_eq!(
        error("root ::= \"x\"\nnext = \"y\""),
        "grammar line 2: expected ::= after next, found \"= \\\"y\\\"\""
    );
    assert_eq!(
        error("root ::= * \"x\""),
        "grammar line 1: * has nothing before it to repeat"
    );
    assert_eq!(
        error("root ::= \"x\"{3,2}"),
        "grammar line 1: repetition {3,2} has its maximum below its minimum"
    );
    assert_eq!(
        error("root ::= \"\\q\""),
        "grammar line 1: unknown escape \\q"
    );
    assert_eq!(
        error("root ::= (\"a\" \"b\""),
        "grammar line 1: expected ) at the end"
    );
    assert_eq!(
        error("root ::= \"a\"\n  | \"b\""),
        "grammar line 2: expected a rule name at \"| \\\"b\\\"\""
    );
}

#[test]
fn left_recursion_is_refused() {
    assert_eq!(
        error("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]"),
        "grammar line 2: rule expr is left-recursive (it can reach itself before matching any text)"
    );
    assert!(
        error("root ::= a\na ::= space a \"x\" | \"y\"\nspace ::= \" \"?")
            .contains("left-recursive")
    );
    check("root ::= \"(\" root \")\" | \"x\"").unwrap();
}

#[test]
fn what_llama_cpp_refuses_for_repetitions_is_refused() {
    // `x*` of something that can be empty: llama.cpp's rule for it refers to
    // itself before any text.
    assert_eq!(
        error("root ::= (\"a\"?)*"),
        "grammar line 1: rule root repeats without end (* or +) something that can match no text, which llama.cpp refuses as left recursion"
    );
    assert_eq!(
        error("root ::= \"\"*"),
        "grammar line 1: * has nothing before it to repeat"
    );
    // A bounded repetition of an optional thing is a chain, not a cycle.
    check("root ::= (\"a\"?){0,3} \"b\"").unwrap();
    assert_eq!(
        error("root ::= (\"a\"{0,100}){0,30}"),
        "grammar line 1: a repetition of a group of 101 rules 30 times makes more than 2000 rules (llama.cpp's limit); nest fewer repetitions"
    );
}

#[test]
fn hostile_grammars_are_refused_without_deep_recursion() {
    // Each of these ran a stack out (or took minutes) before there were
    // limits; run them on a small stack to prove the checks do not recurse.
    let run = |grammar: String| on_small_stack(move || check(&grammar).map_err(|e| e.to_string()));
    assert_eq!(
        run(nested_groups(100_000)).unwrap_err(),
        "grammar line 1: groups nest deeper than 64 levels; write deep structure as rules that refer to each other"
    );
    run(nested_groups(64)).unwrap();
    assert_eq!(
        run(rule_chain(20_000)).unwrap_err(),
        format!(
            "grammar line 1: the grammar is {} bytes; at most 262144 are accepted",
            rule_chain(20_000).len()
        )
    );
    assert_eq!(
        run(rule_chain(5_000)).unwrap_err(),
        "grammar line 3978: rule r3976 enters a chain of more than 1024 rules before matching any text (limit 1024)"
    );
    run(rule_chain(1_000)).unwrap();
    // A chain of rules that each match text first is as deep as it likes.
    let mut deep = String::from("root ::= r0\n");
    for i in 0..5_000 {
        deep.push_str(&format!("r{i} ::= \"x\" r{}\n", i + 1));
    }
    deep.push_str("r5000 ::= \"a\"\n");
    run(deep).unwrap();
    // Left recursion at the end of a long chain is still found.
    let mut cycle = rule_chain(900);
    cycle.push_str("r900 ::= r0 | \"a\"\n");
    assert!(run(cycle).unwrap_err().contains("is left-recursive"));
}

#[test]
fn ambiguity_that_multiplies_is_refused() {
    // Every rule goes on in two ways into the next: 2^9 ways at the start.
    let doubling = doubling(9);
    assert!(
        error(&doubling).contains("can go on in more than 256 ways at one point"),
        "{}",
        error(&doubling)
    );
    // Rules that branch and meet again while empty: 3^k rules entered.
    let mut branching = String::from("root ::= r0 \"a\"\n");
    for i in 0..30 {
        branching.push_str(&format!("r{i} ::= r{0} r{0} r{0}\n", i + 1));
    }
    branching.push_str("r30 ::= \"\"\n");
    assert!(
        error(&branching).contains("enters more than 4096 rules from one point"),
        "{}",
        error(&branching)
    );
    // Each of many rules enters 3^7 rules (within the limit), but llama.cpp's
    // left-recursion check walks them again from each: 500 × 3^7 steps.
    let mut walked = String::from("root ::=");
    for j in 0..500 {
        walked.push_str(&format!(" \"z\" x{j}"));
    }
    walked.push('\n');
    for j in 0..500 {
        walked.push_str(&format!("x{j} ::= d0 \"a\"\n"));
    }
    for i in 0..7 {
        walked.push_str(&format!("d{i} ::= d{0} d{0} d{0}\n", i + 1));
    }
    walked.push_str("d7 ::= \"\"\n");
    assert!(
        error(&walked).contains("paths before matching any text"),
        "{}",
        error(&walked)
    );
    // Alternatives up to the limit are fine.
    let values: Vec<String> = (0..256).map(|i| format!("\"v{i}\"")).collect();
    check(&format!("root ::= {}", values.join(" | "))).unwrap();
    let values: Vec<String> = (0..257).map(|i| format!("\"v{i}\"")).collect();
    assert!(error(&format!("root ::= {}", values.join(" | "))).contains("256 ways"));
}

#[test]
fn repetitions_cannot_blow_the_grammar_up() {
    let long = "x".repeat(1000);
    assert_eq!(
        error(&format!("root ::= \"{long}\"{{2000}}")),
        "grammar line 1: the grammar expands to more than 131072 elements (repetitions copy what they repeat); make it smaller"
    );
    check(&format!("root ::= \"{long}\"{{0,100}}")).unwrap();
}
