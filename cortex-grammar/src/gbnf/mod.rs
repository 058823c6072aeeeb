//! A GBNF checker that follows llama.cpp's grammar parser: the same syntax
//! (rules on one line unless inside parentheses or after `|`, literals,
//! character classes with escapes, `.`, groups, `* + ? {m,n}`), lowered into
//! the rules llama.cpp builds from it (a group is a rule, a repetition a
//! chain of rules), then the checks llama.cpp makes when it loads a grammar
//! (every rule used is defined, `root` exists, no rule is left-recursive)
//! and the bounds of [`crate::limits`], so that whatever passes loads and
//! runs there in bounded time, memory and stack.
//!
//! Everything here is iterative or recurses at most
//! [`MAX_GROUP_NESTING`](crate::limits::MAX_GROUP_NESTING) deep, and linear
//! in the size of the lowered grammar, itself bounded.

use std::fmt;

use crate::limits::MAX_GRAMMAR_BYTES;

mod analysis;
mod parse;

/// A grammar llama.cpp would refuse, or one past a limit: the line of the
/// problem and what it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct GrammarError {
    /// 1-based line in the grammar text.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for GrammarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "grammar line {}: {}", self.line, self.message)
    }
}

/// Checks `grammar` (GBNF text, start rule `root`).
pub fn check(grammar: &str) -> Result<(), GrammarError> {
    if grammar.len() > MAX_GRAMMAR_BYTES {
        return Err(GrammarError {
            line: 1,
            message: format!(
                "the grammar is {} bytes; at most {MAX_GRAMMAR_BYTES} are accepted",
                grammar.len()
            ),
        });
    }
    let grammar = parse::lower(grammar)?;
    analysis::check(&grammar)
}

/// A grammar as llama.cpp holds it: rules numbered in the order their names
/// first appear (groups and repetitions get numbers as they are met), each
/// a list of alternatives.
struct Lowered {
    rules: Vec<Rule>,
    /// The `root` rule, when its name appears at all.
    root: Option<usize>,
}

struct Rule {
    /// The named rule this one is (or was made for, for a group or a
    /// repetition), for messages.
    origin: usize,
    /// The name, for a named rule.
    name: Option<String>,
    /// Where it is defined, or where it was first seen until then.
    line: usize,
    /// A rule made for a repetition without a maximum (`*`, `+`, `{m,}`):
    /// it refers to itself.
    unbounded_repetition: bool,
    /// `None` until defined.
    alternatives: Option<Vec<Vec<Symbol>>>,
}

#[derive(Debug, Clone, Copy)]
enum Symbol {
    /// Literal characters or a character class (never empty).
    Text,
    /// Another rule, and the line that uses it.
    Rule { id: usize, line: usize },
}

impl Lowered {
    /// The name a message gives rule `id`: its own, or that of the named
    /// rule it was made for.
    fn name(&self, id: usize) -> &str {
        let origin = &self.rules[self.rules[id].origin];
        origin.name.as_deref().unwrap_or("?")
    }

    /// "rule NAME `what`", at the line of rule `id`.
    fn rule_error(&self, id: usize, what: &str) -> GrammarError {
        GrammarError {
            line: self.rules[id].line,
            message: format!("rule {} {what}", self.name(id)),
        }
    }
}

#[cfg(test)]
mod tests;
