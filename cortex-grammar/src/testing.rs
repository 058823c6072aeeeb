//! Grammars and schemas a hostile client might send, each past (or at) one
//! of [`crate::limits`]: for this crate's tests and the end-to-end ones in
//! `tests/` (`hostile.rs`). Not part of the API.

use serde_json::{Map, Value, json};

/// `depth` groups, one inside the other, around `"a"`.
pub fn nested_groups(depth: usize) -> String {
    format!("root ::= {}\"a\"{}", "(".repeat(depth), ")".repeat(depth))
}

/// `count` rules, each entering the next before any text.
pub fn rule_chain(count: usize) -> String {
    let mut grammar = String::from("root ::= r0\n");
    for i in 0..count {
        grammar.push_str(&format!("r{i} ::= r{}\n", i + 1));
    }
    grammar.push_str(&format!("r{count} ::= \"a\"\n"));
    grammar
}

/// `levels` rules, each going on two ways into the next: 2^levels ways at
/// the start.
pub fn doubling(levels: usize) -> String {
    let mut grammar = String::from("root ::= r0\n");
    for i in 0..levels {
        grammar.push_str(&format!("r{i} ::= r{0} | r{0} \"x\"\n", i + 1));
    }
    grammar.push_str(&format!("r{levels} ::= \"a\"\n"));
    grammar
}

/// A schema that is a chain of `count` `$ref`s, each to the next.
pub fn ref_chain(count: usize) -> Value {
    let mut defs = Map::new();
    for i in 0..count {
        defs.insert(
            format!("d{i}"),
            json!({"$ref": format!("#/$defs/d{}", i + 1)}),
        );
    }
    defs.insert(format!("d{count}"), json!({"type": "string"}));
    json!({"$defs": defs, "$ref": "#/$defs/d0"})
}

/// Runs `f` on a thread with a 256 KiB stack: code that recursed as deep as
/// its input would overflow it (and the test would fail) rather than pass.
pub fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(f)
        .expect("a thread")
        .join()
        .expect("no stack overflow")
}
