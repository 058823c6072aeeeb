//! Function calls written as Python (`[get_weather(city='Paris'), now()]`),
//! the way several templates ask a model to write them (Llama 3.x's
//! built-in tools, functionary, Command R+): read back into calls, each
//! argument a Python literal turned into JSON.

use cortex_request::ToolCall;
use serde_json::Value;

/// A call with no id yet (ids are given when a response is made).
pub(crate) fn call(name: &str, arguments: String) -> ToolCall {
    ToolCall {
        id: String::new(),
        name: name.to_owned(),
        arguments,
    }
}

/// Where the text from `at` on stops being whitespace.
pub(crate) fn skip_space(text: &str, at: usize) -> usize {
    at + (text[at..].len() - text[at..].trim_start().len())
}

/// `[name(key='value'), other()]`, the whole of `text`.
pub(crate) fn python_call_list(text: &str) -> Option<Vec<ToolCall>> {
    let (calls, end) = python_calls(text, 0)?;
    (skip_space(text, end) == text.len()).then_some(calls)
}

/// `[name(key='value', n=1), other()]` at `at`.
pub(crate) fn python_calls(text: &str, at: usize) -> Option<(Vec<ToolCall>, usize)> {
    let mut parser = PythonCalls { text, pos: at };
    let calls = parser.calls()?;
    Some((calls, parser.pos))
}

struct PythonCalls<'t> {
    text: &'t str,
    pos: usize,
}

impl<'t> PythonCalls<'t> {
    fn rest(&self) -> &'t str {
        &self.text[self.pos..]
    }

    fn space(&mut self) {
        self.pos = skip_space(self.text, self.pos);
    }

    fn eat(&mut self, c: char) -> bool {
        self.space();
        if self.rest().starts_with(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn identifier(&mut self) -> Option<String> {
        self.space();
        let len = self
            .rest()
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
            .unwrap_or(self.rest().len());
        (len > 0).then(|| {
            let id = self.rest()[..len].to_owned();
            self.pos += len;
            id
        })
    }

    fn calls(&mut self) -> Option<Vec<ToolCall>> {
        let bracketed = self.eat('[');
        let mut calls = Vec::new();
        loop {
            let name = self.identifier()?;
            if !self.eat('(') {
                return None;
            }
            let mut arguments = serde_json::Map::new();
            if !self.eat(')') {
                loop {
                    let key = self.identifier()?;
                    if !self.eat('=') {
                        return None;
                    }
                    let value = self.literal()?;
                    arguments.insert(key, value);
                    if self.eat(')') {
                        break;
                    }
                    if !self.eat(',') {
                        return None;
                    }
                }
            }
            calls.push(call(&name, Value::Object(arguments).to_string()));
            if !bracketed || !self.eat(',') {
                break;
            }
        }
        if bracketed && !self.eat(']') {
            return None;
        }
        Some(calls)
    }

    /// A Python literal: a string, a number, True/False/None, a list or a dict.
    fn literal(&mut self) -> Option<Value> {
        self.space();
        let rest = self.rest();
        let quote = rest.chars().next()?;
        if quote == '\'' || quote == '"' {
            let mut out = String::new();
            let mut chars = rest[1..].char_indices();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        let (_, escaped) = chars.next()?;
                        out.push(match escaped {
                            'n' => '\n',
                            't' => '\t',
                            other => other,
                        });
                    }
                    c if c == quote => {
                        self.pos += 1 + i + 1;
                        return Some(Value::String(out));
                    }
                    c => out.push(c),
                }
            }
            return None;
        }
        if self.eat('[') {
            let mut items = Vec::new();
            while !self.eat(']') {
                items.push(self.literal()?);
                if !self.eat(',') && !self.rest().trim_start().starts_with(']') {
                    return None;
                }
            }
            return Some(Value::Array(items));
        }
        if self.eat('{') {
            let mut map = serde_json::Map::new();
            while !self.eat('}') {
                let key = match self.literal()? {
                    Value::String(key) => key,
                    other => other.to_string(),
                };
                if !self.eat(':') {
                    return None;
                }
                map.insert(key, self.literal()?);
                if !self.eat(',') && !self.rest().trim_start().starts_with('}') {
                    return None;
                }
            }
            return Some(Value::Object(map));
        }
        let len = rest
            .find(|c: char| matches!(c, ',' | ')' | ']' | '}') || c.is_whitespace())
            .unwrap_or(rest.len());
        let word = &rest[..len];
        let value = match word {
            "True" | "true" => Value::Bool(true),
            "False" | "false" => Value::Bool(false),
            "None" | "null" => Value::Null,
            number => serde_json::from_str::<serde_json::Number>(number)
                .ok()
                .map(Value::Number)?,
        };
        self.pos += len;
        Some(value)
    }
}
