//! GBNF text → the rules llama.cpp builds from it (`llama_grammar_parser`):
//! the same syntax, the same numbering, groups as rules, repetitions
//! expanded as llama.cpp expands them, with every size bounded before it
//! is reached.

use std::collections::HashMap;

use super::{GrammarError, Lowered, Rule, Symbol};
use crate::limits::{MAX_GRAMMAR_ELEMENTS, MAX_GROUP_NESTING, MAX_REPETITIONS};

/// Parses and lowers `text`.
pub(super) fn lower(text: &str) -> Result<Lowered, GrammarError> {
    let mut parser = Parser {
        text: text.as_bytes(),
        pos: 0,
        line: 1,
        rules: Vec::new(),
        ids: HashMap::new(),
        elements: 0,
    };
    parser.grammar()?;
    let root = parser.ids.get("root").copied();
    Ok(Lowered {
        rules: parser.rules,
        root,
    })
}

struct Parser<'a> {
    text: &'a [u8],
    pos: usize,
    line: usize,
    rules: Vec<Rule>,
    ids: HashMap<String, usize>,
    /// llama.cpp grammar elements made so far (characters, class entries,
    /// references and the ends of alternatives).
    elements: usize,
}

/// A symbol of a sequence being read, and how many elements it is in
/// llama.cpp (a literal is one per character).
type Part = (Symbol, usize);

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

    /// Counts `more` elements, refusing a grammar that grows past the limit.
    fn grow(&mut self, more: u64) -> Result<(), GrammarError> {
        let total = (self.elements as u64).saturating_add(more);
        if total > MAX_GRAMMAR_ELEMENTS as u64 {
            return self.error(format!(
                "the grammar expands to more than {MAX_GRAMMAR_ELEMENTS} elements (repetitions copy what they repeat); make it smaller"
            ));
        }
        self.elements = total as usize;
        Ok(())
    }

    /// The number of the rule called `name`, made on first sight.
    fn symbol(&mut self, name: String) -> usize {
        if let Some(&id) = self.ids.get(&name) {
            return id;
        }
        let id = self.rules.len();
        self.rules.push(Rule {
            origin: id,
            name: Some(name.clone()),
            line: self.line,
            unbounded_repetition: false,
            alternatives: None,
        });
        self.ids.insert(name, id);
        id
    }

    /// A new rule for a group or a repetition inside rule `origin`.
    fn generated(&mut self, origin: usize, unbounded_repetition: bool) -> usize {
        self.rules.push(Rule {
            origin,
            name: None,
            line: self.line,
            unbounded_repetition,
            alternatives: None,
        });
        self.rules.len() - 1
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

    fn grammar(&mut self) -> Result<(), GrammarError> {
        self.space(true);
        while self.peek().is_some() {
            let line = self.line;
            let name = self.name()?;
            let id = self.symbol(name.clone());
            self.space(false);
            if !self.text[self.pos..].starts_with(b"::=") {
                return self.error(format!("expected ::= after {name}, found {}", self.here()));
            }
            self.pos += 3;
            self.space(true);
            let alternatives = self.alternatives(id, 0)?;
            match self.peek() {
                None | Some(b'\r' | b'\n') => {}
                Some(_) => {
                    return self.error(format!(
                        "expected the end of rule {name}, found {}",
                        self.here()
                    ));
                }
            }
            self.space(true);
            // llama.cpp keeps the last definition; so does this.
            let rule = &mut self.rules[id];
            rule.alternatives = Some(alternatives);
            rule.line = line;
        }
        Ok(())
    }

    /// `a | b | ...` inside rule `origin`, `depth` groups deep.
    fn alternatives(
        &mut self,
        origin: usize,
        depth: usize,
    ) -> Result<Vec<Vec<Symbol>>, GrammarError> {
        let mut alternatives = vec![self.sequence(origin, depth)?];
        while self.peek() == Some(b'|') {
            self.pos += 1;
            self.space(true);
            alternatives.push(self.sequence(origin, depth)?);
        }
        self.grow(alternatives.len() as u64)?;
        Ok(alternatives)
    }

    fn sequence(&mut self, origin: usize, depth: usize) -> Result<Vec<Symbol>, GrammarError> {
        let nested = depth > 0;
        let mut parts: Vec<Part> = Vec::new();
        // As in llama.cpp: where the last symbol starts (what a repetition
        // repeats), and how many rules it made (a group's, for the limit on
        // repeating repetitions).
        let mut last_start = 0;
        let mut last_rules: u64 = 1;
        while let Some(c) = self.peek() {
            let part = match c {
                b'"' => {
                    self.pos += 1;
                    let mut chars = 0;
                    loop {
                        match self.peek() {
                            None | Some(b'\n') => {
                                return self.error("a literal is not closed before the line ends");
                            }
                            Some(b'"') => break,
                            Some(_) => {
                                self.char()?;
                                chars += 1;
                            }
                        }
                    }
                    self.pos += 1;
                    // An empty literal is nothing at all in llama.cpp.
                    (chars > 0).then_some((Symbol::Text, chars))
                }
                b'[' => {
                    self.pos += 1;
                    if self.peek() == Some(b'^') {
                        self.pos += 1;
                    }
                    let mut entries = 0;
                    loop {
                        match self.peek() {
                            None | Some(b'\n') => {
                                return self
                                    .error("a character class is not closed before the line ends");
                            }
                            Some(b']') => break,
                            Some(_) => {
                                self.char()?;
                                entries += 1;
                                if self.peek() == Some(b'-')
                                    && self.text.get(self.pos + 1) != Some(&b']')
                                {
                                    self.pos += 1;
                                    self.char()?;
                                    entries += 1;
                                }
                            }
                        }
                    }
                    self.pos += 1;
                    Some((Symbol::Text, entries.max(1)))
                }
                b'.' => {
                    self.pos += 1;
                    Some((Symbol::Text, 1))
                }
                b'(' => {
                    if depth >= MAX_GROUP_NESTING {
                        return self.error(format!(
                            "groups nest deeper than {MAX_GROUP_NESTING} levels; write deep structure as rules that refer to each other"
                        ));
                    }
                    let line = self.line;
                    self.pos += 1;
                    self.space(true);
                    let before = self.rules.len();
                    let id = self.generated(origin, false);
                    let group = self.alternatives(origin, depth + 1)?;
                    self.rules[id].alternatives = Some(group);
                    if self.peek() != Some(b')') {
                        return self.error(format!("expected ) at {}", self.here()));
                    }
                    self.pos += 1;
                    last_start = parts.len();
                    last_rules = (self.rules.len() - before).max(1) as u64;
                    parts.push((Symbol::Rule { id, line }, 1));
                    self.grow(1)?;
                    self.space(nested);
                    continue;
                }
                b'*' | b'+' | b'?' | b'{' => {
                    let (min, max) = match c {
                        b'*' => (0, None),
                        b'+' => (1, None),
                        b'?' => (0, Some(1)),
                        _ => self.counts(nested)?,
                    };
                    if c != b'{' {
                        self.pos += 1;
                    }
                    let repeated = Repeated {
                        operator: c,
                        start: last_start,
                        rules: last_rules,
                        min,
                        max,
                    };
                    last_rules = self.repeat(&mut parts, &repeated, origin)?;
                    self.space(nested);
                    continue;
                }
                b'<' | b'!' => {
                    return self.error(
                        "token references (<...>) are not supported here; write the text as a literal",
                    );
                }
                c if is_word(c) => {
                    let line = self.line;
                    let name = self.name()?;
                    Some((
                        Symbol::Rule {
                            id: self.symbol(name),
                            line,
                        },
                        1,
                    ))
                }
                _ => break,
            };
            last_start = parts.len();
            last_rules = 1;
            if let Some((symbol, elements)) = part {
                self.grow(elements as u64)?;
                parts.push((symbol, elements));
            }
            self.space(nested);
        }
        Ok(parts.into_iter().map(|(symbol, _)| symbol).collect())
    }

    /// Expands a repetition of `parts[repeated.start..]` as llama.cpp does:
    /// `min` copies, then a chain of optional rules (one rule that refers
    /// to itself when there is no maximum). Returns the rules it made times
    /// those repeated, llama.cpp's measure for the next repetition.
    fn repeat(
        &mut self,
        parts: &mut Vec<Part>,
        repeated: &Repeated,
        origin: usize,
    ) -> Result<u64, GrammarError> {
        let &Repeated {
            operator,
            start,
            rules,
            min,
            max,
        } = repeated;
        if start >= parts.len() {
            return self.error(format!(
                "{} has nothing before it to repeat",
                operator as char
            ));
        }
        let total_rules = match max {
            Some(max) if max > 0 => max,
            _ => min.max(1),
        };
        if rules.saturating_mul(total_rules) > MAX_REPETITIONS {
            return self.error(format!(
                "a repetition of a group of {rules} rules {total_rules} times makes more than {MAX_REPETITIONS} rules (llama.cpp's limit); nest fewer repetitions"
            ));
        }
        let previous: Vec<Part> = parts[start..].to_vec();
        let previous_elements: u64 = previous.iter().map(|&(_, e)| e as u64).sum();
        let optional = match max {
            None => 1,
            Some(max) => max - min,
        };
        // Copies beyond the first, then each optional rule: a copy, a
        // reference, the ends of its two alternatives; then the reference
        // to the chain.
        let copies = previous_elements.saturating_mul(min.saturating_sub(1));
        let chain = optional.saturating_mul(previous_elements + 3) + u64::from(optional > 0);
        self.grow(copies.saturating_add(chain))?;
        if min == 0 {
            parts.truncate(start);
        } else {
            for _ in 1..min {
                parts.extend_from_slice(&previous);
            }
        }
        let line = self.line;
        let mut last: Option<usize> = None;
        for i in 0..optional {
            let id = self.generated(origin, max.is_none());
            let mut alternative: Vec<Symbol> = previous.iter().map(|&(s, _)| s).collect();
            let next = if max.is_none() { Some(id) } else { last };
            if let (true, Some(next)) = (i > 0 || max.is_none(), next) {
                alternative.push(Symbol::Rule { id: next, line });
            }
            self.rules[id].alternatives = Some(vec![alternative, Vec::new()]);
            last = Some(id);
        }
        if let Some(id) = last {
            parts.push((Symbol::Rule { id, line }, 1));
        }
        Ok(rules * total_rules)
    }

    /// `{m}`, `{m,}` or `{m,n}`: the counts.
    fn counts(&mut self, nested: bool) -> Result<(u64, Option<u64>), GrammarError> {
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
        Ok((min, max))
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

/// A repetition operator and what it applies to.
struct Repeated {
    /// `*`, `+`, `?` or `{`.
    operator: u8,
    /// Where in the sequence the repeated symbol starts.
    start: usize,
    /// The rules it made (llama.cpp's `n_prev_rules`).
    rules: u64,
    min: u64,
    max: Option<u64>,
}
