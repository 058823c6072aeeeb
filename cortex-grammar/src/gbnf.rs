//! A GBNF checker that follows llama.cpp's grammar parser: the same syntax
//! (rules on one line unless inside parentheses or after `|`, literals,
//! character classes with escapes, `.`, groups, `* + ? {m,n}`), then the
//! checks llama.cpp makes when it builds a grammar (every rule used is
//! defined, `root` exists, no rule is left-recursive).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// A grammar llama.cpp would refuse: the line of the problem and what it is.
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

/// llama.cpp's limit on `{m,n}` counts.
const MAX_REPETITIONS: u64 = 2000;

/// Checks `grammar` (GBNF text, start rule `root`).
pub fn check(grammar: &str) -> Result<(), GrammarError> {
    let mut parser = Parser {
        text: grammar.as_bytes(),
        pos: 0,
        line: 1,
    };
    let rules = parser.grammar()?;
    let Some(_) = rules.get("root") else {
        return Err(GrammarError {
            line: 1,
            message: "the grammar has no root rule (generation starts at `root ::= ...`)".into(),
        });
    };
    for rule in rules.values() {
        for (name, line) in rule.alternatives.iter().flat_map(|a| references(a)) {
            if !rules.contains_key(name) {
                return Err(GrammarError {
                    line,
                    message: format!("rule {name} is used but not defined"),
                });
            }
        }
    }
    left_recursion(&rules)
}

/// One element of a sequence and how often it may repeat.
#[derive(Debug)]
struct Item {
    element: Element,
    /// Whether it may be absent (`*`, `?`, `{0,...}`).
    optional: bool,
}

#[derive(Debug)]
enum Element {
    /// A literal; `true` when it is empty (`""`).
    Literal(bool),
    /// A character class or `.`.
    Char,
    /// A rule, and the line it is used on.
    Reference(String, usize),
    Group(Vec<Vec<Item>>),
}

struct Rule {
    alternatives: Vec<Vec<Item>>,
}

fn references(sequence: &[Item]) -> Vec<(&str, usize)> {
    let mut out = Vec::new();
    for item in sequence {
        match &item.element {
            Element::Reference(name, line) => out.push((name.as_str(), *line)),
            Element::Group(alternatives) => {
                out.extend(alternatives.iter().flat_map(|a| references(a)));
            }
            Element::Literal(_) | Element::Char => {}
        }
    }
    out
}

struct Parser<'a> {
    text: &'a [u8],
    pos: usize,
    line: usize,
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    fn error<T>(&self, message: impl Into<String>) -> Result<T, GrammarError> {
        Err(GrammarError {
            line: self.line,
            message: message.into(),
        })
    }

    /// Skips blanks and `#` comments; newlines too when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' => self.pos += 1,
                b'#' => {
                    while self.peek().is_some_and(|c| c != b'\n' && c != b'\r') {
                        self.pos += 1;
                    }
                }
                b'\r' | b'\n' if newlines => {
                    if c == b'\n' {
                        self.line += 1;
                    }
                    self.pos += 1;
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Result<String, GrammarError> {
        let start = self.pos;
        while self.peek().is_some_and(is_word) {
            self.pos += 1;
        }
        if start == self.pos {
            return self.error(format!("expected a rule name at {}", self.here()));
        }
        Ok(String::from_utf8_lossy(&self.text[start..self.pos]).into_owned())
    }

    /// A few characters from the current position, for messages.
    fn here(&self) -> String {
        let rest = &self.text[self.pos..];
        if rest.is_empty() {
            return "the end".into();
        }
        let shown: String = String::from_utf8_lossy(&rest[..rest.len().min(20)])
            .chars()
            .take_while(|&c| c != '\n')
            .collect();
        format!("{shown:?}")
    }

    fn grammar(&mut self) -> Result<BTreeMap<String, Rule>, GrammarError> {
        let mut rules: BTreeMap<String, Rule> = BTreeMap::new();
        self.space(true);
        while self.peek().is_some() {
            let name = self.name()?;
            self.space(false);
            if !self.text[self.pos..].starts_with(b"::=") {
                return self.error(format!("expected ::= after {name}, found {}", self.here()));
            }
            self.pos += 3;
            self.space(true);
            let alternatives = self.alternatives(false)?;
            match self.peek() {
                None => {}
                Some(b'\r' | b'\n') => {}
                Some(_) => {
                    return self.error(format!(
                        "expected the end of rule {name}, found {}",
                        self.here()
                    ));
                }
            }
            self.space(true);
            // llama.cpp keeps the last definition; so does this.
            rules.insert(name, Rule { alternatives });
        }
        Ok(rules)
    }

    fn alternatives(&mut self, nested: bool) -> Result<Vec<Vec<Item>>, GrammarError> {
        let mut alternatives = vec![self.sequence(nested)?];
        while self.peek() == Some(b'|') {
            self.pos += 1;
            self.space(true);
            alternatives.push(self.sequence(nested)?);
        }
        Ok(alternatives)
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Item>, GrammarError> {
        let mut items: Vec<Item> = Vec::new();
        while let Some(c) = self.peek() {
            let element = match c {
                b'"' => {
                    self.pos += 1;
                    let mut empty = true;
                    loop {
                        match self.peek() {
                            None | Some(b'\n') => {
                                return self.error("a literal is not closed before the line ends");
                            }
                            Some(b'"') => break,
                            Some(_) => {
                                self.char()?;
                                empty = false;
                            }
                        }
                    }
                    self.pos += 1;
                    Element::Literal(empty)
                }
                b'[' => {
                    self.pos += 1;
                    if self.peek() == Some(b'^') {
                        self.pos += 1;
                    }
                    loop {
                        match self.peek() {
                            None | Some(b'\n') => {
                                return self
                                    .error("a character class is not closed before the line ends");
                            }
                            Some(b']') => break,
                            Some(_) => {
                                self.char()?;
                                if self.peek() == Some(b'-')
                                    && self.text.get(self.pos + 1) != Some(&b']')
                                {
                                    self.pos += 1;
                                    self.char()?;
                                }
                            }
                        }
                    }
                    self.pos += 1;
                    Element::Char
                }
                b'.' => {
                    self.pos += 1;
                    Element::Char
                }
                b'(' => {
                    self.pos += 1;
                    self.space(true);
                    let group = self.alternatives(true)?;
                    if self.peek() != Some(b')') {
                        return self.error(format!("expected ) at {}", self.here()));
                    }
                    self.pos += 1;
                    Element::Group(group)
                }
                b'*' | b'+' | b'?' | b'{' => {
                    let Some(last) = items.last_mut() else {
                        return self
                            .error(format!("{} has nothing before it to repeat", c as char));
                    };
                    let min = match c {
                        b'*' | b'?' => 0,
                        b'+' => 1,
                        _ => self.counts(nested)?,
                    };
                    if c != b'{' {
                        self.pos += 1;
                    }
                    last.optional |= min == 0;
                    self.space(nested);
                    continue;
                }
                b'<' => {
                    return self.error(
                        "token references (<...>) are not supported here; write the text as a literal",
                    );
                }
                c if is_word(c) => Element::Reference(self.name()?, self.line),
                _ => break,
            };
            items.push(Item {
                element,
                optional: false,
            });
            self.space(nested);
        }
        Ok(items)
    }

    /// `{m}`, `{m,}` or `{m,n}`; returns `m`.
    fn counts(&mut self, nested: bool) -> Result<u64, GrammarError> {
        self.pos += 1;
        self.space(nested);
        let min = self.integer()?;
        self.space(nested);
        let mut max = Some(min);
        if self.peek() == Some(b',') {
            self.pos += 1;
            self.space(nested);
            max = if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                Some(self.integer()?)
            } else {
                None
            };
            self.space(nested);
        }
        if self.peek() != Some(b'}') {
            return self.error(format!("expected }} at {}", self.here()));
        }
        self.pos += 1;
        if let Some(max) = max
            && max < min
        {
            return self.error(format!(
                "repetition {{{min},{max}}} has its maximum below its minimum"
            ));
        }
        if min.max(max.unwrap_or(0)) > MAX_REPETITIONS {
            return self.error(format!(
                "a repetition count above {MAX_REPETITIONS} (llama.cpp's limit)"
            ));
        }
        Ok(min)
    }

    fn integer(&mut self) -> Result<u64, GrammarError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if start == self.pos {
            return self.error(format!("expected a number at {}", self.here()));
        }
        std::str::from_utf8(&self.text[start..self.pos])
            .ok()
            .and_then(|s| s.parse().ok())
            .map_or_else(|| self.error("a repetition count is too large"), Ok)
    }

    /// One character of a literal or class: an escape or a UTF-8 sequence.
    fn char(&mut self) -> Result<(), GrammarError> {
        if self.peek() != Some(b'\\') {
            let len = match self.peek() {
                Some(c) if c >= 0xF0 => 4,
                Some(c) if c >= 0xE0 => 3,
                Some(c) if c >= 0xC0 => 2,
                _ => 1,
            };
            self.pos = (self.pos + len).min(self.text.len());
            return Ok(());
        }
        self.pos += 1;
        let digits = match self.peek() {
            Some(b'x') => 2,
            Some(b'u') => 4,
            Some(b'U') => 8,
            Some(b't' | b'r' | b'n' | b'\\' | b'"' | b'[' | b']') => 0,
            _ => {
                let next = String::from_utf8_lossy(&self.text[self.pos..])
                    .chars()
                    .next()
                    .map_or_else(|| "at the end".to_owned(), String::from);
                return self.error(format!("unknown escape \\{next}"));
            }
        };
        self.pos += 1;
        for _ in 0..digits {
            if !self.peek().is_some_and(|c| c.is_ascii_hexdigit()) {
                return self.error(format!("expected {digits} hex digits in an escape"));
            }
            self.pos += 1;
        }
        Ok(())
    }
}

/// Whether a rule can match the empty text, for every rule (a fixpoint).
fn nullable_rules(rules: &BTreeMap<String, Rule>) -> BTreeSet<&str> {
    let mut nullable = BTreeSet::new();
    loop {
        let before = nullable.len();
        for (name, rule) in rules {
            if rule
                .alternatives
                .iter()
                .any(|a| sequence_nullable(a, &nullable))
            {
                nullable.insert(name.as_str());
            }
        }
        if nullable.len() == before {
            return nullable;
        }
    }
}

fn sequence_nullable(sequence: &[Item], nullable: &BTreeSet<&str>) -> bool {
    sequence.iter().all(|item| item_nullable(item, nullable))
}

fn item_nullable(item: &Item, nullable: &BTreeSet<&str>) -> bool {
    item.optional
        || match &item.element {
            Element::Literal(empty) => *empty,
            Element::Char => false,
            Element::Reference(name, _) => nullable.contains(name.as_str()),
            Element::Group(alternatives) => {
                alternatives.iter().any(|a| sequence_nullable(a, nullable))
            }
        }
}

/// The rules a sequence can start with (through nullable elements).
fn leftmost<'r>(sequence: &'r [Item], nullable: &BTreeSet<&str>, out: &mut Vec<(&'r str, usize)>) {
    for item in sequence {
        match &item.element {
            Element::Reference(name, line) => out.push((name, *line)),
            Element::Group(alternatives) => {
                for alternative in alternatives {
                    leftmost(alternative, nullable, out);
                }
            }
            Element::Literal(_) | Element::Char => {}
        }
        if !item_nullable(item, nullable) {
            break;
        }
    }
}

/// Refuses a rule that can reach itself without consuming text.
fn left_recursion(rules: &BTreeMap<String, Rule>) -> Result<(), GrammarError> {
    let nullable = nullable_rules(rules);
    let edges: BTreeMap<&str, Vec<(&str, usize)>> = rules
        .iter()
        .map(|(name, rule)| {
            let mut out = Vec::new();
            for alternative in &rule.alternatives {
                leftmost(alternative, &nullable, &mut out);
            }
            (name.as_str(), out)
        })
        .collect();
    // Depth-first search; a rule found on the current path is a cycle.
    let mut done: BTreeSet<&str> = BTreeSet::new();
    for start in rules.keys() {
        let mut path: Vec<(&str, usize)> = vec![(start, 0)];
        while let Some(&(rule, next)) = path.last() {
            if done.contains(rule) {
                path.pop();
                continue;
            }
            let targets = &edges[rule];
            if let Some(&(target, line)) = targets.get(next) {
                path.last_mut().expect("non-empty").1 += 1;
                if path.iter().any(|(r, _)| *r == target) {
                    return Err(GrammarError {
                        line,
                        message: format!(
                            "rule {target} is left-recursive (it can reach itself before matching any text)"
                        ),
                    });
                }
                if !done.contains(target) {
                    path.push((target, 0));
                }
            } else {
                done.insert(rule);
                path.pop();
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
