//! A template's own way of writing function calls, learned from the
//! template itself and read back out of generated text.
//!
//! The template is rendered twice with the same turn: once as text, once
//! as calls to probe functions with probe arguments. What differs is how it
//! writes calls (`<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`,
//! `[TOOL_CALLS]name[ARGS]{...}`, `<function=name><parameter=k>v</parameter>`,
//! ...). Where the probe's name, keys and values sit in that text gives the
//! markers around them, in one of four shapes: a JSON value holding the
//! calls; a name followed by its arguments as JSON; a name followed by
//! its arguments one by one between markers; a Python call. Two calls,
//! the first with two arguments, show what repeats per call (and per
//! argument) and what opens and closes them all. This is how llama.cpp's
//! newer chat parsers work out a template's format (a differential
//! analysis), so a template nobody wrote a parser for is read as well.

use cortex_request::ToolCall;
use serde_json::Value;

use crate::open_calls::{CallFields, CallSoFar, json_calls_so_far};
use crate::python_calls::{call, python_calls, skip_space};

/// How one template writes calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NativeCalls {
    /// Before the first call (`<｜tool▁calls▁begin｜>`), often empty.
    pub(crate) section_open: Pattern,
    /// Before each call (`<tool_call>`); may be empty for a bare JSON call.
    pub(crate) call_open: Pattern,
    /// How a call's name and arguments are written.
    pub(crate) body: Body,
    /// After each call (`</tool_call>`), often empty.
    pub(crate) call_close: Pattern,
    /// After the last call.
    pub(crate) section_close: Pattern,
    /// One call exactly as the template wrote it, around its JSON (a
    /// grammar that forces a call writes these).
    pub(crate) written: Written,
}

/// One call as the template wrote it, cut where the JSON goes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Written {
    /// Before the call's JSON value (or its name).
    pub(crate) before: String,
    /// Between the name and the arguments (`[ARGS]`), for a name then JSON.
    pub(crate) between: String,
    /// After the JSON.
    pub(crate) after: String,
    /// The JSON value is an array of calls.
    pub(crate) array: bool,
}

/// How a call's name and arguments are written between its markers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Body {
    /// A JSON value: one call object or an array of them.
    Json(JsonCall),
    /// The name, a marker, the arguments as a JSON object.
    NameThenJson {
        /// Between the name and the arguments (`[ARGS]`, `<｜tool▁sep｜>`).
        name_close: Pattern,
    },
    /// The name, then each argument as key and value between markers.
    NameThenArguments {
        /// After the name (`>`), before the first argument or the close.
        name_close: Pattern,
        /// Before each argument but the first (`,`), or before each.
        key_open: Pattern,
        /// Between a key and its value.
        key_close: Pattern,
        /// After each value.
        value_close: Pattern,
    },
    /// `[name(key='value', ...)]`: Python's call syntax.
    Python,
}

/// Where a call's name and arguments sit in its JSON object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JsonCall {
    /// At these paths (`["name"]`, `["function", "name"]`), the arguments
    /// as an object or as JSON text.
    Fields {
        name: Vec<String>,
        arguments: Vec<String>,
        /// The arguments are written as JSON text in a string.
        arguments_as_text: bool,
    },
    /// `{"name": {arguments}}`.
    Keyed,
}

/// A marker: literal text with holes for what changes from call to call
/// (an id, an index).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Pattern(Vec<Piece>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    /// Any run of characters up to the next text.
    Hole,
}

impl Pattern {
    /// The literal `text`, its probe values (`ids`) turned into holes, a
    /// number standing alone (a call's index: `functions.f:0`) too,
    /// surrounding whitespace dropped.
    fn learned(text: &str, ids: &[&str]) -> Self {
        let mut text = text.trim().to_owned();
        for id in ids {
            text = text.replace(id, "\u{0}");
        }
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut chars = text.chars().peekable();
        let mut previous: Option<char> = None;
        while let Some(c) = chars.next() {
            let index = c.is_ascii_digit()
                && previous.is_none_or(|p| matches!(p, ':' | '=' | '"' | '\'' | ' '));
            if c == '\u{0}' || index {
                while chars.peek().is_some_and(char::is_ascii_digit) {
                    chars.next();
                }
                if !literal.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut literal)));
                }
                if pieces.last() != Some(&Piece::Hole) {
                    pieces.push(Piece::Hole);
                }
            } else {
                literal.push(c);
            }
            previous = Some(c);
        }
        if !literal.is_empty() {
            pieces.push(Piece::Text(literal));
        }
        Self(pieces)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The literal texts, for the tokens that must be kept as text.
    pub(crate) fn texts(&self) -> impl Iterator<Item = &str> {
        self.0.iter().filter_map(|p| match p {
            Piece::Text(t) => Some(t.as_str()),
            Piece::Hole => None,
        })
    }

    /// The first literal text, where a search for the pattern starts.
    fn first_text(&self) -> Option<&str> {
        self.texts().next()
    }

    /// Matches at `at` (whitespace before each literal skipped): the end.
    fn match_at(&self, text: &str, at: usize) -> Option<usize> {
        let mut pos = at;
        let mut hole = false;
        for piece in &self.0 {
            match piece {
                Piece::Hole => hole = true,
                Piece::Text(literal) => {
                    if hole {
                        let found = text[pos..].find(literal.as_str())?;
                        // A hole holds a short run without a line break.
                        let gap = &text[pos..pos + found];
                        if gap.len() > 64 || gap.contains('\n') {
                            return None;
                        }
                        pos += found + literal.len();
                        hole = false;
                    } else {
                        pos = skip_space(text, pos);
                        if !text[pos..].starts_with(literal.as_str()) {
                            return None;
                        }
                        pos += literal.len();
                    }
                }
            }
        }
        if hole {
            // A trailing hole: an id or index, up to the next space.
            let run = text[pos..]
                .find(|c: char| c.is_whitespace())
                .unwrap_or(text.len() - pos);
            pos += run;
        }
        Some(pos)
    }

    /// The first place at or after `from` where it matches: (start, end).
    fn find(&self, text: &str, from: usize) -> Option<(usize, usize)> {
        let first = self.first_text()?;
        let mut search = from;
        while let Some(found) = text[search..].find(first) {
            let start = search + found;
            // A leading hole starts wherever its run of text starts.
            let start = match self.0.first() {
                Some(Piece::Hole) => text[..start]
                    .rfind(char::is_whitespace)
                    .map_or(from, |i| (i + 1).max(from)),
                _ => start,
            };
            if let Some(end) = self.match_at(text, start) {
                return Some((start, end));
            }
            search = search + found + first.len();
        }
        None
    }
}

/// The calls read out of a text, and the text around them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Found {
    pub(crate) content: String,
    pub(crate) calls: Vec<ToolCall>,
}

impl NativeCalls {
    /// The literal texts of every marker (kept as text when generated).
    pub(crate) fn marker_texts(&self) -> Vec<&str> {
        let mut texts: Vec<&str> = [
            &self.section_open,
            &self.call_open,
            &self.call_close,
            &self.section_close,
        ]
        .into_iter()
        .flat_map(Pattern::texts)
        .collect();
        match &self.body {
            Body::NameThenJson { name_close } => texts.extend(name_close.texts()),
            Body::NameThenArguments {
                name_close,
                key_open,
                key_close,
                value_close,
            } => {
                for pattern in [name_close, key_open, key_close, value_close] {
                    texts.extend(pattern.texts());
                }
            }
            Body::Json(_) | Body::Python => {}
        }
        texts
    }

    /// Reads the calls out of `text`, or `None` when it holds none that
    /// parse (an ordinary answer).
    pub(crate) fn parse(&self, text: &str) -> Option<Found> {
        let (start, mut pos) = self.first_call(text)?;
        let mut calls = Vec::new();
        loop {
            let (call, end) = self.call_at(text, pos, calls.len())?;
            calls.extend(call);
            pos = end;
            pos = self.call_close.match_at(text, pos).unwrap_or(pos);
            if self.call_open.is_empty() {
                // Calls follow one another directly, until the section closes.
                let closes = !self.section_close.is_empty()
                    && self.section_close.match_at(text, pos).is_some();
                if closes || skip_space(text, pos) == text.len() {
                    break;
                }
                if self.call_at(text, pos, calls.len()).is_none() {
                    break;
                }
                continue;
            }
            match self.call_open.match_at(text, pos) {
                Some(next) => pos = next,
                None => break,
            }
        }
        let pos = self.section_close.match_at(text, pos).unwrap_or(pos);
        let before = text[..start].trim();
        let after = text[pos..].trim();
        let content = match (before.is_empty(), after.is_empty()) {
            (_, true) => before.to_owned(),
            (true, false) => after.to_owned(),
            (false, false) => format!("{before}\n{after}"),
        };
        (!calls.is_empty()).then_some(Found { content, calls })
    }

    /// Of an output still being written: where its first call starts, the
    /// calls written whole so far, and the one being written.
    pub(crate) fn calls_so_far(
        &self,
        text: &str,
    ) -> Option<(usize, Vec<ToolCall>, Option<CallSoFar>)> {
        let (start, mut pos) = self.first_call(text)?;
        let mut calls = Vec::new();
        while let Some((call, end)) = self.call_at(text, pos, calls.len()) {
            // A JSON value ends where it ends; a call whose close is still
            // to come may yet grow (a name then arguments between markers).
            let closed = match self.call_close.match_at(text, end) {
                Some(after) => after,
                None if matches!(self.body, Body::Json(_)) => end,
                None => return Some((start, calls, Some(CallSoFar::unnamed(true)))),
            };
            calls.extend(call);
            pos = match self.call_open.match_at(text, closed) {
                Some(next) if !self.call_open.is_empty() => next,
                _ if self.call_open.is_empty() && skip_space(text, closed) < text.len() => closed,
                _ => return Some((start, calls, None)),
            };
        }
        let open = self.call_being_written(text, pos, &mut calls);
        Some((start, calls, open))
    }

    /// The call whose body starts at `at` and is not whole yet; calls that
    /// an array being written holds whole go to `calls`.
    fn call_being_written(
        &self,
        text: &str,
        at: usize,
        calls: &mut Vec<ToolCall>,
    ) -> Option<CallSoFar> {
        let marked = !(self.section_open.is_empty() && self.call_open.is_empty());
        let at = skip_space(text, at);
        match &self.body {
            Body::Json(shape) => {
                let fields = match shape {
                    JsonCall::Fields {
                        name, arguments, ..
                    } => CallFields::Paths {
                        name: name.clone(),
                        arguments: vec![arguments.clone()],
                    },
                    JsonCall::Keyed => CallFields::Keyed,
                };
                let (whole, open, _) = json_calls_so_far(&text[at..], &fields, marked)?;
                calls.extend(whole);
                open
            }
            Body::NameThenJson { name_close } => {
                let Some((name_end, args_start)) = name_close.find(text, at) else {
                    return Some(CallSoFar::unnamed(true));
                };
                let arguments = &text[skip_space(text, args_start)..];
                Some(CallSoFar {
                    name: call_name(&text[at..name_end]).map(str::to_owned),
                    arguments: if arguments.starts_with('{') {
                        arguments.to_owned()
                    } else {
                        String::new()
                    },
                    marked: true,
                })
            }
            // Told whole once written.
            Body::NameThenArguments { .. } | Body::Python => Some(CallSoFar::unnamed(true)),
        }
    }

    /// Where the first call starts (its section's opening) and where its
    /// body begins.
    fn first_call(&self, text: &str) -> Option<(usize, usize)> {
        let opening = if self.section_open.is_empty() {
            &self.call_open
        } else {
            &self.section_open
        };
        if opening.is_empty() {
            // A bare JSON call: the whole answer is the call.
            let start = skip_space(text, 0);
            return text[start..]
                .starts_with(['{', '['])
                .then_some((start, start));
        }
        let mut from = 0;
        loop {
            let (start, end) = opening.find(text, from)?;
            let body = if self.section_open.is_empty() {
                Some(end)
            } else {
                self.call_open.match_at(text, end)
            };
            if let Some(body) = body {
                return Some((start, body));
            }
            from = start + 1;
        }
    }

    /// One call's body at `at` (the `index`-th call): the calls it holds
    /// (an array holds several) and where it ends.
    fn call_at(&self, text: &str, at: usize, index: usize) -> Option<(Vec<ToolCall>, usize)> {
        let at = skip_space(text, at);
        match &self.body {
            Body::Json(shape) => {
                let (value, end) = json_at(text, at)?;
                let calls = match &value {
                    Value::Array(items) if !items.is_empty() => items
                        .iter()
                        .map(|item| json_call(shape, item))
                        .collect::<Option<Vec<_>>>()?,
                    _ => vec![json_call(shape, &value)?],
                };
                Some((calls, end))
            }
            Body::NameThenJson { name_close } => {
                let (name_end, args_start) = name_close.find(text, at)?;
                let name = call_name(&text[at..name_end])?;
                let (arguments, end) = json_at(text, skip_space(text, args_start))?;
                if !arguments.is_object() {
                    return None;
                }
                let arguments = text[skip_space(text, args_start)..end].to_owned();
                Some((vec![call(name, arguments)], end))
            }
            Body::NameThenArguments {
                name_close,
                key_open,
                key_close,
                value_close,
            } => {
                let (name_end, mut pos) = if name_close.is_empty() {
                    // The name runs to its first argument or the call's close.
                    let end = [key_open.find(text, at), self.call_close.find(text, at)]
                        .into_iter()
                        .flatten()
                        .map(|(start, _)| start)
                        .min()?;
                    (end, end)
                } else {
                    name_close.find(text, at)?
                };
                let name = call_name(&text[at..name_end])?;
                let mut arguments = serde_json::Map::new();
                loop {
                    // The first argument may come without its separator.
                    let key_start = match key_open.match_at(text, pos) {
                        Some(after) if !key_open.is_empty() => after,
                        _ if arguments.is_empty() && !key_close.is_empty() => pos,
                        _ => break,
                    };
                    let Some((key_end, value_start)) = key_close.find(text, key_start) else {
                        break;
                    };
                    let key = text[key_start..key_end].trim();
                    let (value_end, next) = value_close.find(text, value_start)?;
                    if key.is_empty() || key.len() > 128 || key.contains('\n') {
                        return None;
                    }
                    let raw = text[value_start..value_end].trim();
                    let value = serde_json::from_str(raw).unwrap_or_else(|_| Value::from(raw));
                    arguments.insert(key.to_owned(), value);
                    pos = next;
                }
                let _ = index;
                Some((vec![call(name, Value::Object(arguments).to_string())], pos))
            }
            Body::Python => python_calls(text, at),
        }
    }
}

/// A function's name as written before its arguments: a namespace
/// (`functions.get`) and surrounding whitespace dropped.
fn call_name(text: &str) -> Option<&str> {
    let name = text.trim();
    let name = name.rsplit_once("functions.").map_or(name, |(_, n)| n);
    let valid = !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
    valid.then_some(name)
}

/// The JSON value that starts at `at`, and where it ends.
pub(crate) fn json_at(text: &str, at: usize) -> Option<(Value, usize)> {
    let mut values = serde_json::Deserializer::from_str(&text[at..]).into_iter::<Value>();
    let value = values.next()?.ok()?;
    Some((value, at + values.byte_offset()))
}

/// One call out of a JSON call object.
fn json_call(shape: &JsonCall, value: &Value) -> Option<ToolCall> {
    let (name, arguments) = match shape {
        JsonCall::Fields {
            name, arguments, ..
        } => {
            let at = |path: &[String]| path.iter().try_fold(value, |v, key| v.get(key));
            let args = match at(arguments) {
                None | Some(Value::Null) => "{}".to_owned(),
                Some(Value::String(text)) => text.clone(),
                Some(object @ Value::Object(_)) => object.to_string(),
                Some(_) => return None,
            };
            (at(name)?.as_str()?.to_owned(), args)
        }
        JsonCall::Keyed => {
            let Value::Object(map) = value else {
                return None;
            };
            let mut entries = map.iter();
            let (name, args) = entries.next()?;
            if entries.next().is_some() || !args.is_object() {
                return None;
            }
            (name.clone(), args.to_string())
        }
    };
    Some(call(&name, arguments))
}

/// The probes: names, keys and values no template writes on its own.
pub(crate) mod probe {
    pub(crate) const FIRST: &str = "probe_fn_first";
    pub(crate) const SECOND: &str = "probe_fn_second";
    pub(crate) const KEY_A: &str = "probe_key_a";
    pub(crate) const VALUE_A: &str = "probe_value_a";
    pub(crate) const KEY_B: &str = "probe_key_b";
    pub(crate) const VALUE_B: &str = "probe_value_b";
    /// Mistral's templates take ids of nine letters or digits only.
    pub(crate) const ID_FIRST: &str = "prbidaaaa";
    pub(crate) const ID_SECOND: &str = "prbidbbbb";
}

/// The calls text of one probe call (`one`, one argument) and of two
/// (`two`: the first with two arguments, the second with one; `None` when
/// the template takes one call at a time), as the template writes them:
/// the shape and markers, or `None` when it writes them in no way found
/// here.
pub(crate) fn learn(one: &str, two: Option<&str>) -> Option<NativeCalls> {
    use probe::*;
    // One call at a time: the second call is written as the first was.
    let single;
    let two = match two.filter(|two| two.contains(SECOND)) {
        Some(two) => two,
        None => {
            single = format!("{one}{}", one.replace(FIRST, SECOND));
            &single
        }
    };
    let ids = [ID_FIRST, ID_SECOND];
    let name_at = one.find(FIRST)?;
    // 1. A JSON value that holds the name.
    if let Some((start, end, value)) = json_holding(one, FIRST) {
        let shape = json_shape(&value)?;
        // Two calls: in one array (one prefix), or each in its own markers.
        let (second_start, _, _) = json_holding(&two[start.min(two.len())..], SECOND)
            .map(|(s, e, v)| (s + start, e + start, v))?;
        let first_end = json_holding(two, FIRST).map(|(_, e, _)| e)?;
        let (call_open, call_close, section_open, section_close) = if second_start < first_end {
            // One value holds both: the markers are the section's.
            (
                Pattern::learned(&one[..start], &ids),
                Pattern::learned(&one[end..], &ids),
                Pattern::default(),
                Pattern::default(),
            )
        } else {
            split_repeats(
                &one[..start],
                &one[end..],
                &two[first_end..second_start],
                &ids,
            )
        };
        return Some(NativeCalls {
            section_open,
            call_open,
            body: Body::Json(shape),
            call_close,
            section_close,
            written: Written {
                before: one[..start].to_owned(),
                between: String::new(),
                after: one[end..].to_owned(),
                array: value.is_array(),
            },
        });
    }
    // 2. Python's call syntax.
    let after_name = &one[name_at + FIRST.len()..];
    if after_name.starts_with('(') {
        let open = one[..name_at].trim_end().trim_end_matches('[');
        let close_at = one.rfind(')')? + 1;
        let close = one[close_at..].trim_start().trim_start_matches(']');
        return Some(NativeCalls {
            section_open: Pattern::default(),
            call_open: Pattern::learned(open, &ids),
            body: Body::Python,
            call_close: Pattern::learned(close, &ids),
            section_close: Pattern::default(),
            written: Written::default(),
        });
    }
    // 3. The name, then its arguments as a JSON object.
    if let Some(found) = name_then_json(one, two, name_at, &ids) {
        return Some(found);
    }
    // 4. The name, then each argument between markers (two show the seams).
    let first_name = two.find(FIRST)?;
    let key_a = two[first_name..].find(KEY_A)? + first_name;
    let value_a = two[key_a..].find(VALUE_A)? + key_a;
    let key_b = two[value_a..].find(KEY_B)? + value_a;
    let value_b = two[key_b..].find(VALUE_B)? + key_b;
    let second_name = two[value_b..].find(SECOND)? + value_b;
    let name_tail = &two[first_name + FIRST.len()..key_a];
    let key_close = &two[key_a + KEY_A.len()..value_a];
    let gap = &two[value_a + VALUE_A.len()..key_b];
    let after_last = &two[value_b + VALUE_B.len()..second_name];
    let value_close = common_prefix(gap, after_last);
    let key_open = &gap[value_close.len()..];
    let name_close = name_tail.strip_suffix(key_open).unwrap_or(name_tail);
    // One argument: what follows its value is the call's close.
    let value_one = one.find(VALUE_A)? + VALUE_A.len();
    let one_after = one[value_one..]
        .strip_prefix(value_close)
        .unwrap_or(&one[value_one..]);
    let (call_open, call_close, section_open, section_close) = split_repeats(
        &one[..name_at],
        one_after,
        &after_last[value_close.len()..],
        &ids,
    );
    Some(NativeCalls {
        section_open,
        call_open,
        body: Body::NameThenArguments {
            name_close: Pattern::learned(name_close, &ids),
            key_open: Pattern::learned(key_open, &ids),
            key_close: Pattern::learned(key_close, &ids),
            value_close: Pattern::learned(value_close, &ids),
        },
        call_close,
        section_close,
        written: Written::default(),
    })
}

/// Step 3 of [`learn`]: the name at `name_at`, then a JSON object of the
/// arguments.
fn name_then_json(one: &str, two: &str, name_at: usize, ids: &[&str]) -> Option<NativeCalls> {
    use probe::*;
    let key = format!("\"{KEY_A}\"");
    let args_key = one[name_at..].find(&key)? + name_at;
    let brace = one[name_at..args_key].rfind('{')? + name_at;
    let (_, args_end) = json_at(one, brace)?;
    let name_close = Pattern::learned(&one[name_at + FIRST.len()..brace], ids);
    let second_name = two.find(SECOND)?;
    let first_args_end = {
        let key_at = two.find(&key)?;
        json_at(two, two[..key_at].rfind('{')?)?.1
    };
    let (call_open, call_close, section_open, section_close) = split_repeats(
        &one[..name_at],
        &one[args_end..],
        two.get(first_args_end..second_name)?,
        ids,
    );
    Some(NativeCalls {
        section_open,
        call_open,
        body: Body::NameThenJson { name_close },
        call_close,
        section_close,
        written: Written {
            before: one[..name_at].to_owned(),
            between: one[name_at + FIRST.len()..brace].to_owned(),
            after: one[args_end..].to_owned(),
            array: false,
        },
    })
}

/// The markers of one call (`open` before it, `close` after it) split
/// into what repeats per call and what opens and closes them all, from
/// `between`, what the template writes between two calls (one call's close
/// and the next one's open).
fn split_repeats(
    open: &str,
    close: &str,
    between: &str,
    ids: &[&str],
) -> (Pattern, Pattern, Pattern, Pattern) {
    // The call's close is where `close` and `between` agree; the rest of
    // `between` opens the next call, and the section is what `open` has
    // before that. (The second call's id is written as the first's, to
    // compare them.)
    let between = ids
        .iter()
        .skip(1)
        .fold(between.to_owned(), |text, id| text.replace(id, ids[0]));
    let between = between.as_str();
    let call_close = common_prefix(close, between);
    let call_open = &between[call_close.len()..];
    let open_trimmed = open.trim_end();
    let call_open_trimmed = call_open.trim();
    let (section_open, call_open) = match open_trimmed.strip_suffix(call_open_trimmed) {
        Some(section) if !call_open_trimmed.is_empty() => (section, call_open_trimmed),
        // The calls follow one another without markers of their own.
        _ => (open_trimmed, ""),
    };
    let section_close = &close[call_close.len()..];
    (
        Pattern::learned(call_open, ids),
        Pattern::learned(call_close, ids),
        Pattern::learned(section_open, ids),
        Pattern::learned(section_close, ids),
    )
}

/// What `a` and `b` start with, up to a whole marker: a marker begun and
/// not closed (`</parameter>\n<` before `parameter=` and `/function>`)
/// is left out.
fn common_prefix<'a>(a: &'a str, b: &str) -> &'a str {
    let len = a
        .char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or(a.len().min(b.len()), |((i, _), _)| i);
    let shared = &a[..len];
    match shared.rfind(['<', '[']) {
        Some(open) if !shared[open..].contains(['>', ']']) => &shared[..open],
        _ => shared,
    }
}

/// The outermost JSON value (object or array) in `text` that holds
/// `name` as a string or a key: where it starts and ends.
fn json_holding(text: &str, name: &str) -> Option<(usize, usize, Value)> {
    let at = text.find(name)?;
    let mut best = None;
    for (start, c) in text[..at].char_indices() {
        if c != '{' && c != '[' {
            continue;
        }
        if let Some((value, end)) = json_at(text, start)
            && end > at
            && holds(&value, name)
        {
            best = Some((start, end, value));
            break;
        }
    }
    best
}

fn holds(value: &Value, name: &str) -> bool {
    match value {
        Value::String(s) => s == name,
        Value::Array(items) => items.iter().any(|v| holds(v, name)),
        Value::Object(map) => map.iter().any(|(k, v)| k == name || holds(v, name)),
        _ => false,
    }
}

/// Where the probe's name and arguments sit in its call object.
fn json_shape(value: &Value) -> Option<JsonCall> {
    let call = match value {
        Value::Array(items) => items.first()?,
        other => other,
    };
    let Value::Object(map) = call else {
        return None;
    };
    if map.contains_key(probe::FIRST) {
        return Some(JsonCall::Keyed);
    }
    let name = path_to(call, &|v| v.as_str() == Some(probe::FIRST))?;
    let arguments = path_to(call, &|v| match v {
        Value::Object(m) => m.contains_key(probe::KEY_A),
        Value::String(s) => s.contains(probe::KEY_A),
        _ => false,
    })?;
    let arguments_as_text = arguments
        .iter()
        .try_fold(call, |v, key| v.get(key))
        .is_some_and(Value::is_string);
    Some(JsonCall::Fields {
        name,
        arguments,
        arguments_as_text,
    })
}

/// The keys leading to the first value `wanted` accepts.
fn path_to(value: &Value, wanted: &dyn Fn(&Value) -> bool) -> Option<Vec<String>> {
    if let Value::Object(map) = value {
        for (key, item) in map {
            if wanted(item) {
                return Some(vec![key.clone()]);
            }
            if let Some(mut rest) = path_to(item, wanted) {
                rest.insert(0, key.clone());
                return Some(rest);
            }
        }
    }
    None
}
