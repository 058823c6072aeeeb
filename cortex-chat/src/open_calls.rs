//! Calls written as JSON, read while they are written: each call's name
//! once it is whole, and its arguments as far as they go, in the text the
//! finished call will hold (`serde_json`'s: no space outside strings, its
//! escapes, numbers as it prints them), so that what a stream tells of a
//! call's arguments is always the start of what the finished call holds.

use cortex_request::ToolCall;
use serde_json::Value;

/// Where a call object keeps its name and arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallFields {
    /// The name at `name` (`["name"]`, `["function", "name"]`), the
    /// arguments at the first of `arguments` present: an object, or JSON
    /// text in a string.
    Paths {
        name: Vec<String>,
        arguments: Vec<Vec<String>>,
    },
    /// `{"name": {arguments}}`.
    Keyed,
}

impl CallFields {
    /// The fields most models write: `name`, then `arguments` (or Llama's
    /// `parameters`).
    pub(crate) fn common() -> Self {
        Self::Paths {
            name: vec!["name".into()],
            arguments: vec![vec!["arguments".into()], vec!["parameters".into()]],
        }
    }

    fn is_name(&self, path: &[String]) -> bool {
        match self {
            Self::Paths { name, .. } => path == name.as_slice(),
            Self::Keyed => false,
        }
    }

    fn is_arguments(&self, path: &[String]) -> bool {
        match self {
            Self::Paths { arguments, .. } => arguments.iter().any(|a| path == a.as_slice()),
            Self::Keyed => path.len() == 1,
        }
    }
}

/// A call read from JSON as far as it is written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct OpenCall {
    /// Its name, once written whole.
    pub(crate) name: Option<String>,
    /// Its arguments' text so far (`None` before they start, or while they
    /// are neither an object nor a string).
    pub(crate) arguments: Option<String>,
    /// Whether its object has ended.
    pub(crate) ended: bool,
}

/// The calls of the JSON value at the start of `text` (one call object, or
/// an array of them), as far as it is written, and where the value ends
/// if it has. `None` when `text` does not start with one, or stops being
/// JSON before it ends (an answer, or a call written wrong).
pub(crate) fn open_calls(
    text: &str,
    fields: &CallFields,
) -> Option<(Vec<OpenCall>, Option<usize>)> {
    let mut scan = Scan::new(fields);
    let mut at = 0;
    while let Some(c) = text[at..].chars().next() {
        let taken = match scan.step(c, &text[at..])? {
            Step::Took(bytes) => bytes,
            Step::Done => return Some((scan.finish(), Some(at + c.len_utf8()))),
        };
        at += taken;
    }
    scan.started.then(|| (scan.finish(), None))
}

/// A call being written, after the whole ones.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct CallSoFar {
    /// Its name, once written whole.
    pub(crate) name: Option<String>,
    /// Its arguments' text so far: the start of what the finished call
    /// holds.
    pub(crate) arguments: String,
    /// Whether a marker says it is a call (a bare JSON object may yet be
    /// an answer).
    pub(crate) marked: bool,
}

impl CallSoFar {
    pub(crate) fn unnamed(marked: bool) -> Self {
        Self {
            marked,
            ..Self::default()
        }
    }

    /// The call as far as it was written, if it got its name.
    pub(crate) fn into_call(self) -> Option<ToolCall> {
        Some(ToolCall {
            id: String::new(),
            name: self.name?,
            arguments: self.arguments,
        })
    }
}

/// What is written so far of calls: the whole ones, the one being
/// written, and where the JSON they are in ended (if it did).
pub(crate) type SoFar = (Vec<ToolCall>, Option<CallSoFar>, Option<usize>);

/// Calls written as JSON at the start of `text` (after any marker,
/// `marked`), read as far as they go: the whole ones as the whole
/// output's parse gives them. `None` when `text` is not JSON.
pub(crate) fn json_calls_so_far(text: &str, fields: &CallFields, marked: bool) -> Option<SoFar> {
    if text.trim().is_empty() {
        return marked.then(|| (Vec::new(), Some(CallSoFar::unnamed(true)), None));
    }
    let (calls, end) = open_calls(text, fields)?;
    let mut whole = Vec::new();
    for call in calls {
        if !call.ended {
            let open = CallSoFar {
                name: call.name,
                arguments: call.arguments.unwrap_or_default(),
                marked,
            };
            return Some((whole, Some(open), end));
        }
        let Some(name) = call.name else {
            // A whole object without a name is no call.
            return Some((whole, None, end));
        };
        whole.push(ToolCall {
            id: String::new(),
            name,
            arguments: call.arguments.unwrap_or_else(|| "{}".to_owned()),
        });
    }
    // Between calls of an array still open: another may come.
    let open = (end.is_none() && marked).then(|| CallSoFar::unnamed(true));
    Some((whole, open, end))
}

/// Calls in the forms most models write (see [`crate::parse_tool_calls`]),
/// read as far as they go from the start of `text`: Hermes' `<tool_call>`
/// blocks, a marker then JSON (`[TOOL_CALLS]`, `<|tool_call|>`,
/// `<|python_tag|>`), or a bare JSON call.
pub(crate) fn common_calls_so_far(text: &str) -> (Vec<ToolCall>, Option<CallSoFar>) {
    let fields = CallFields::common();
    let text = text.trim_start();
    if let Some(mut rest) = text.strip_prefix("<tool_call>") {
        let mut calls = Vec::new();
        loop {
            let body = rest.trim_start();
            let Some((whole, open, end)) = json_calls_so_far(body, &fields, true) else {
                return (calls, None);
            };
            calls.extend(whole);
            let (None, Some(end)) = (&open, end) else {
                return (calls, open);
            };
            let after = body[end..].trim_start();
            let after = after.strip_prefix("</tool_call>").unwrap_or(after);
            match after.trim_start().strip_prefix("<tool_call>") {
                Some(next) => rest = next,
                None => return (calls, None),
            }
        }
    }
    let (body, marked) = ["[TOOL_CALLS]", "<|tool_call|>", "<|python_tag|>"]
        .iter()
        .find_map(|marker| text.strip_prefix(marker))
        .map_or((text, false), |rest| (rest.trim_start(), true));
    match json_calls_so_far(body, &fields, marked) {
        Some((calls, open, _)) => (calls, open),
        None => (Vec::new(), None),
    }
}

/// cortex's envelope for templates without tools (`{"tool_calls": [...]}`),
/// read as far as it goes.
pub(crate) fn envelope_calls_so_far(text: &str) -> (Vec<ToolCall>, Option<CallSoFar>) {
    const KEY: &str = "\"tool_calls\"";
    let Some(inside) = text.trim_start().strip_prefix('{').map(str::trim_start) else {
        return (Vec::new(), None);
    };
    let Some(after_key) = inside.strip_prefix(KEY) else {
        // `{"tool_ca`: the envelope of a call, not an answer's.
        let marked = inside.len() >= 2 && KEY.starts_with(inside);
        return (Vec::new(), marked.then(|| CallSoFar::unnamed(true)));
    };
    let list = after_key
        .trim_start()
        .strip_prefix(':')
        .map(str::trim_start)
        .unwrap_or_default();
    if list.is_empty() {
        return (Vec::new(), Some(CallSoFar::unnamed(true)));
    }
    if !list.starts_with('[') {
        return (Vec::new(), None);
    }
    let fields = CallFields::Paths {
        name: vec!["name".into()],
        arguments: vec![vec!["arguments".into()]],
    };
    match json_calls_so_far(list, &fields, true) {
        Some((calls, open, _)) => (calls, open),
        None => (Vec::new(), None),
    }
}

enum Step {
    /// Go on after this many bytes.
    Took(usize),
    /// The value has ended with this character.
    Done,
}

/// What a container expects next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Key,
    Colon,
    Value,
    /// A `,` or its end.
    Next,
}

#[derive(Debug)]
enum Frame {
    Object { key: Option<String>, want: Want },
    Array { index: usize, want: Want },
}

impl Frame {
    fn want(&self) -> Want {
        match self {
            Self::Object { want, .. } | Self::Array { want, .. } => *want,
        }
    }

    fn set_want(&mut self, to: Want) {
        match self {
            Self::Object { want, .. } | Self::Array { want, .. } => *want = to,
        }
    }
}

struct Scan<'f> {
    fields: &'f CallFields,
    stack: Vec<Frame>,
    started: bool,
    /// The canonical text so far.
    out: String,
    /// A number or literal being read (written out once it ends).
    pending: String,
    /// In a string: whether it is a key, and its decoded text so far.
    string: Option<(bool, String)>,
    calls: Vec<OpenCall>,
    /// The arguments being written.
    arguments: Option<Arguments>,
    /// How deep the calls' objects sit: 0 for one call, 1 in an array.
    call_depth: usize,
}

enum Arguments {
    /// An object starting at `start` in the canonical text, its frame at
    /// stack depth `depth`.
    Json { start: usize, depth: usize },
    /// JSON text in a string (decoded into the call as it comes).
    Text,
}

impl<'f> Scan<'f> {
    fn new(fields: &'f CallFields) -> Self {
        Self {
            fields,
            stack: Vec::new(),
            started: false,
            out: String::new(),
            pending: String::new(),
            string: None,
            calls: Vec::new(),
            arguments: None,
            call_depth: 0,
        }
    }

    /// The path, relative to its call, of the value the top frame holds.
    fn call_path(&self) -> Vec<String> {
        self.stack
            .iter()
            .skip(self.call_depth)
            .map(|frame| match frame {
                Frame::Object { key, .. } => key.clone().unwrap_or_default(),
                Frame::Array { index, .. } => index.to_string(),
            })
            .collect()
    }

    fn call(&mut self) -> Option<&mut OpenCall> {
        self.calls.last_mut()
    }

    /// Takes character `c` (`rest` starts with it).
    fn step(&mut self, c: char, rest: &str) -> Option<Step> {
        let one = Step::Took(c.len_utf8());
        if let Some((is_key, text)) = &mut self.string {
            let is_key = *is_key;
            let (decoded, taken) = match c {
                '"' => {
                    let (_, text) = self.string.take()?;
                    self.out.push('"');
                    if is_key {
                        if let Some(Frame::Object { key, want }) = self.stack.last_mut() {
                            *key = Some(text);
                            *want = Want::Colon;
                        }
                        return Some(one);
                    }
                    self.end_string(text);
                    return Some(self.value_done(one));
                }
                '\\' => match unescape(rest) {
                    Escape::Char(decoded, taken) => (decoded, taken),
                    // Cut inside an escape: the rest is to come.
                    Escape::Partial => return Some(Step::Took(rest.len())),
                    Escape::Invalid => return None,
                },
                c if (c as u32) < 0x20 => return None,
                c => (c, c.len_utf8()),
            };
            text.push(decoded);
            push_escaped(&mut self.out, decoded);
            if !is_key
                && matches!(self.arguments, Some(Arguments::Text))
                && let Some(arguments) = self.call().and_then(|call| call.arguments.as_mut())
            {
                arguments.push(decoded);
            }
            return Some(Step::Took(taken));
        }
        if !self.pending.is_empty() {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '+' | '.') {
                self.pending.push(c);
                return Some(one);
            }
            let scalar = std::mem::take(&mut self.pending);
            let value: Value = serde_json::from_str(&scalar).ok()?;
            self.out.push_str(&value.to_string());
            // A scalar never ends the whole value (that is an object or array).
            self.value_done(Step::Took(0));
        }
        if c.is_whitespace() {
            return Some(one);
        }
        let want = match self.stack.last() {
            Some(frame) => frame.want(),
            None if self.started => return None,
            None => Want::Value,
        };
        match (want, c) {
            (Want::Key, '"') => self.string = Some((true, String::new())),
            (Want::Colon, ':') => self.stack.last_mut()?.set_want(Want::Value),
            (Want::Next, ',') => match self.stack.last_mut()? {
                Frame::Object { key, want } => {
                    *key = None;
                    *want = Want::Key;
                }
                Frame::Array { index, want } => {
                    *index += 1;
                    *want = Want::Value;
                }
            },
            (Want::Next | Want::Key, '}') | (Want::Next | Want::Value, ']') => {
                let closes = matches!(
                    (self.stack.last()?, c),
                    (Frame::Object { .. }, '}') | (Frame::Array { .. }, ']')
                );
                if !closes {
                    return None;
                }
                self.stack.pop();
                self.out.push(c);
                return Some(self.value_done(one));
            }
            (Want::Value, '{' | '[' | '"') => {
                self.value_starts(c)?;
                match c {
                    '{' => self.stack.push(Frame::Object {
                        key: None,
                        want: Want::Key,
                    }),
                    '[' => self.stack.push(Frame::Array {
                        index: 0,
                        want: Want::Value,
                    }),
                    _ => {
                        self.string = Some((false, String::new()));
                        self.out.push('"');
                        return Some(one);
                    }
                }
            }
            (Want::Value, c) if c.is_ascii_digit() || matches!(c, '-' | 't' | 'f' | 'n') => {
                self.value_starts(c)?;
                self.pending.push(c);
                return Some(one);
            }
            _ => return None,
        }
        self.out.push(c);
        Some(one)
    }

    /// A value starts (its first character `c`) in the top frame.
    fn value_starts(&mut self, c: char) -> Option<()> {
        if !self.started {
            self.started = true;
            match c {
                '{' => self.calls.push(OpenCall::default()),
                '[' => self.call_depth = 1,
                _ => return None,
            }
            return Some(());
        }
        if self.stack.len() == self.call_depth {
            // An element of an array of calls.
            if c != '{' {
                return None;
            }
            self.calls.push(OpenCall::default());
            return Some(());
        }
        let path = self.call_path();
        if self.arguments.is_none() && self.fields.is_arguments(&path) {
            match c {
                '{' => {
                    self.arguments = Some(Arguments::Json {
                        start: self.out.len(),
                        depth: self.stack.len() + 1,
                    });
                    let keyed_name = matches!(self.fields, CallFields::Keyed)
                        .then(|| path.first().cloned())
                        .flatten();
                    let call = self.call()?;
                    if keyed_name.is_some() {
                        call.name = keyed_name;
                    }
                    call.arguments = Some(String::new());
                }
                '"' => {
                    self.arguments = Some(Arguments::Text);
                    self.call()?.arguments = Some(String::new());
                }
                _ => {}
            }
        }
        Some(())
    }

    /// A string value ended: a call's name, or its arguments' text.
    fn end_string(&mut self, text: String) {
        let path = self.call_path();
        if self.fields.is_name(&path)
            && let Some(call) = self.call()
        {
            call.name = Some(text);
        }
        if matches!(self.arguments, Some(Arguments::Text)) {
            self.arguments = None;
        }
    }

    /// The value the top frame holds has ended (a container: was popped):
    /// the arguments or the call it closes; `Done` when it was the whole.
    fn value_done(&mut self, then: Step) -> Step {
        if let Some(Arguments::Json { start, depth }) = self.arguments
            && self.stack.len() < depth
        {
            let text = self.out[start..].to_owned();
            if let Some(call) = self.call() {
                call.arguments = Some(text);
            }
            self.arguments = None;
        }
        if self.stack.len() == self.call_depth
            && let Some(call) = self.calls.last_mut()
        {
            call.ended = true;
        }
        match self.stack.last_mut() {
            Some(frame) => {
                frame.set_want(Want::Next);
                then
            }
            None => Step::Done,
        }
    }

    fn finish(mut self) -> Vec<OpenCall> {
        if let Some(Arguments::Json { start, .. }) = self.arguments {
            let text = self.out[start..].to_owned();
            if let Some(call) = self.call() {
                call.arguments = Some(text);
            }
        }
        self.calls
    }
}

enum Escape {
    /// The character and the bytes its escape takes.
    Char(char, usize),
    Partial,
    Invalid,
}

/// The escape at the start of `text` (which starts with `\`).
fn unescape(text: &str) -> Escape {
    let bytes = text.as_bytes();
    let Some(&kind) = bytes.get(1) else {
        return Escape::Partial;
    };
    let simple = match kind {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => return unicode_escape(text),
        _ => return Escape::Invalid,
    };
    Escape::Char(simple, 2)
}

fn unicode_escape(text: &str) -> Escape {
    let hex = |at: usize| -> Option<Option<u32>> {
        let digits = text.get(at..at + 4);
        match digits {
            None if text.len() < at + 4 => None,
            None => Some(None),
            Some(d) => Some(u32::from_str_radix(d, 16).ok()),
        }
    };
    let Some(first) = hex(2) else {
        return Escape::Partial;
    };
    let Some(first) = first else {
        return Escape::Invalid;
    };
    if (0xD800..0xDC00).contains(&first) {
        // A high surrogate: its low half follows as `\uXXXX`.
        if text.len() < 12 {
            return Escape::Partial;
        }
        if !text[6..].starts_with("\\u") {
            return Escape::Invalid;
        }
        let Some(Some(low)) = hex(8) else {
            return Escape::Invalid;
        };
        if !(0xDC00..0xE000).contains(&low) {
            return Escape::Invalid;
        }
        let code = 0x10000 + ((first - 0xD800) << 10) + (low - 0xDC00);
        return char::from_u32(code).map_or(Escape::Invalid, |c| Escape::Char(c, 12));
    }
    char::from_u32(first).map_or(Escape::Invalid, |c| Escape::Char(c, 6))
}

/// `c` inside a JSON string as `serde_json` (and Python's `json.dumps`)
/// writes it.
pub(crate) fn push_escaped(out: &mut String, c: char) {
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{8}' => out.push_str("\\b"),
        '\u{c}' => out.push_str("\\f"),
        c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
        c => out.push(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arguments `serde_json` gives of a whole call (what the parsers
    /// of whole outputs hold).
    fn whole_arguments(call: &Value) -> String {
        match call.get("arguments").or_else(|| call.get("parameters")) {
            Some(Value::String(text)) => text.clone(),
            Some(value) => value.to_string(),
            None => String::new(),
        }
    }

    #[test]
    fn every_prefix_tells_the_start_of_the_whole_calls_arguments() {
        let texts = [
            r#"{"name": "get_weather", "arguments": {"city": "Par\u00e9is \"x\"", "days": 1.50, "n": [1, 2e3, -0], "ok": true, "none": null, "path": "a\/b", "emoji": "\ud83d\ude00"}}"#,
            r#"[{"name": "a", "parameters": {"x": {"y": [ ]}}}, {"name": "b", "arguments": "{\"q\": 1}"}]"#,
            "{\n  \"arguments\" : { \"k\" : \"v\\n\" } ,\n  \"name\" : \"late\"\n}",
        ];
        for text in texts {
            let whole: Value = serde_json::from_str(text).unwrap();
            let expected: Vec<Value> = match &whole {
                Value::Array(calls) => calls.clone(),
                call => vec![call.clone()],
            };
            let (calls, end) = open_calls(text, &CallFields::common()).unwrap();
            assert_eq!(end, Some(text.len()), "{text}");
            assert_eq!(calls.len(), expected.len());
            for (call, expected) in calls.iter().zip(&expected) {
                assert!(call.ended);
                assert_eq!(call.name.as_deref(), expected["name"].as_str());
                assert_eq!(
                    call.arguments.as_deref(),
                    Some(whole_arguments(expected).as_str())
                );
            }
            for cut in (1..text.len()).filter(|&n| text.is_char_boundary(n)) {
                let Some((open, end)) = open_calls(&text[..cut], &CallFields::common()) else {
                    panic!("{:?} is read as no call", &text[..cut]);
                };
                assert_eq!(end, None);
                for (call, whole) in open.iter().zip(&calls) {
                    if let Some(arguments) = &call.arguments {
                        let told = whole.arguments.as_deref().unwrap();
                        assert!(
                            told.starts_with(arguments.as_str()),
                            "{arguments:?} of {told:?}"
                        );
                    }
                    if call.name.is_some() {
                        assert_eq!(call.name, whole.name);
                    }
                }
            }
        }
    }

    #[test]
    fn text_that_is_not_a_call_is_none_and_the_end_of_a_call_is_found() {
        for text in [
            "Sure, {",
            "\"name\"",
            "{\"name\": x}",
            "{\"a\" \"b\"}",
            "[1]",
        ] {
            assert_eq!(open_calls(text, &CallFields::common()), None, "{text}");
        }
        let text = r#"{"name": "f", "arguments": {}}</tool_call> more"#;
        let (calls, end) = open_calls(text, &CallFields::common()).unwrap();
        assert_eq!(&text[..end.unwrap()], r#"{"name": "f", "arguments": {}}"#);
        assert_eq!(calls[0].arguments.as_deref(), Some("{}"));
        let keyed = open_calls(r#"{"get_time": {"zone": "UT"#, &CallFields::Keyed).unwrap();
        assert_eq!(keyed.0[0].name.as_deref(), Some("get_time"));
        assert_eq!(keyed.0[0].arguments.as_deref(), Some(r#"{"zone":"UT"#));
    }
}
