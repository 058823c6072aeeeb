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

/// `calls` written as Python, `[get_weather(city="Paris"), now()]`: what
/// [`python_call_list`] reads. `None` when a call's arguments are not a
/// JSON object whose keys are identifiers (nothing to pass as keywords).
pub(crate) fn write_python_calls(calls: &[ToolCall]) -> Option<String> {
    let mut out = String::from("[");
    for (i, call) in calls.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let Ok(Value::Object(arguments)) = serde_json::from_str::<Value>(&call.arguments) else {
            return None;
        };
        if !is_identifier(&call.name) || !arguments.keys().all(|key| is_identifier(key)) {
            return None;
        }
        out.push_str(&call.name);
        out.push('(');
        for (j, (key, value)) in arguments.iter().enumerate() {
            if j > 0 {
                out.push_str(", ");
            }
            out.push_str(key);
            out.push('=');
            python_literal(value, &mut out);
        }
        out.push(')');
    }
    out.push(']');
    Some(out)
}

fn is_identifier(text: &str) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// `value` as a Python literal, in the escapes the reader below takes.
/// (Nesting is bounded by the JSON parser that made `value`.)
fn python_literal(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(text) => {
            out.push('"');
            for c in text.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\t' => out.push_str("\\t"),
                    '\r' => out.push_str("\\r"),
                    c => out.push(c),
                }
            }
            out.push('"');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_literal(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_literal(&Value::String(key.clone()), out);
                out.push_str(": ");
                python_literal(item, out);
            }
            out.push('}');
        }
    }
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
                            'r' => '\r',
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_calls_read_back_as_they_were() {
        let calls = vec![
            call(
                "get_weather",
                r#"{"city":"Paris \"centre\"\n\\ \t\r","days":3,"hourly":true}"#.into(),
            ),
            call(
                "search",
                r#"{"filters":{"tags":["a","b"],"min":-1.5,"none":null,"off":false}}"#.into(),
            ),
            call("now", "{}".into()),
        ];
        let written = write_python_calls(&calls).unwrap();
        assert!(
            written.starts_with(r#"[get_weather(city="Paris \"centre\"\n"#),
            "{written}"
        );
        let read = python_call_list(&written).unwrap();
        let values = |calls: &[ToolCall]| -> Vec<(String, Value)> {
            calls
                .iter()
                .map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).unwrap()))
                .collect()
        };
        assert_eq!(values(&read), values(&calls));
    }

    #[test]
    fn calls_python_cannot_take_as_keywords_are_not_written() {
        for arguments in [r#"{"not an identifier":1}"#, "[1, 2]", "not json"] {
            assert_eq!(write_python_calls(&[call("f", arguments.into())]), None);
        }
        assert_eq!(write_python_calls(&[call("no-dash", "{}".into())]), None);
    }
}
