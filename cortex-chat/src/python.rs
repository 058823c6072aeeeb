//! What chat templates expect of Python's Jinja, where minijinja differs:
//! values print as Python's `str()` prints them (`True`, `None`,
//! `{'a': 1}`), `tojson` is `json.dumps` as `transformers` calls it (`", "`
//! and `": "` between items, no ASCII escaping, `indent`, `separators`,
//! `sort_keys`), an undefined value has length 0, the string methods
//! pycompat lacks (`rsplit`, `removeprefix`, ...), and a namespace's lists
//! change in place (`ns.ids.append(x)`, `ns.ids.pop(0)`), as Kimi K2's
//! template queues its calls' ids.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, Rest, ValueKind, ValueOrKwargs};
use minijinja::{Error, ErrorKind, State, Value};

/// Sets `env` to print, filter and call methods as Jinja under Python does.
pub(crate) fn behave_as_python(env: &mut minijinja::Environment<'_>) {
    env.set_unknown_method_callback(unknown_method);
    env.set_formatter(formatter);
    env.add_filter("tojson", tojson);
    env.add_filter("string", string);
    env.add_filter("length", length);
    env.add_filter("count", length);
    env.add_filter("indent", indent);
    env.add_function("namespace", namespace);
}

/// `namespace(...)`, whose lists are [`ListInPlace`]s: Python's lists are
/// changed by their methods, minijinja's values never are.
pub(crate) fn namespace(defaults: Option<ValueOrKwargs>) -> Result<Value, Error> {
    let defaults = defaults.map(|defaults| {
        let defaults = defaults.into_value();
        match defaults
            .as_object()
            .and_then(minijinja::value::DynObject::try_iter_pairs)
        {
            Some(pairs) => Value::from_pairs(pairs.map(|(key, value)| {
                let value = if value.kind() == ValueKind::Seq {
                    Value::from_object(ListInPlace(Mutex::new(
                        value.try_iter().into_iter().flatten().collect(),
                    )))
                } else {
                    value
                };
                (key, value)
            })),
            None => defaults,
        }
    });
    minijinja::functions::namespace(defaults.map(ValueOrKwargs::from))
}

/// A list a template changes with Python's methods (`append`, `extend`,
/// `insert`, `pop`, `clear`); it reads as any list. At most
/// [`LIST_IN_PLACE_ITEMS`] items: fuel counts steps, and `extend` doubles a
/// list in one.
#[derive(Debug)]
struct ListInPlace(Mutex<Vec<Value>>);

/// The most items a [`ListInPlace`] holds (a chat's ids or turns are a few).
const LIST_IN_PLACE_ITEMS: usize = 100_000;

impl ListInPlace {
    fn items(&self) -> std::sync::MutexGuard<'_, Vec<Value>> {
        // A panic while holding it ends the render; the list is its own.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Object for ListInPlace {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let items = self.items();
        let index = i64::try_from(key.clone()).ok()?;
        let len = i64::try_from(items.len()).ok()?;
        let index = if index < 0 { index + len } else { index };
        items.get(usize::try_from(index).ok()?).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.items().clone())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.items().len())
    }

    fn is_true(self: &Arc<Self>) -> bool {
        !self.items().is_empty()
    }

    fn call_method(
        self: &Arc<Self>,
        state: &mut State<'_, '_>,
        method: &str,
        args: &[Value],
    ) -> Result<Value, Error> {
        // The arguments are read before the list is locked: one may be the
        // list itself (`ns.ids.extend(ns.ids)`).
        let extension: Option<Vec<Value>> = match (method, args) {
            ("extend", [values]) => Some(values.try_iter()?.collect()),
            _ => None,
        };
        let mut items = self.items();
        let growth = match method {
            "append" | "insert" => 1,
            _ => extension.as_ref().map_or(0, Vec::len),
        };
        if items.len() + growth > LIST_IN_PLACE_ITEMS {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("{method}: a list of more than {LIST_IN_PLACE_ITEMS} items"),
            ));
        }
        state.consume_fuel(growth as u64)?;
        // Python's index: negative from the end, clamped to the list.
        let index = |at: &Value, len: usize| -> Result<usize, Error> {
            let at = i64::try_from(at.clone())?;
            let len = i64::try_from(len).unwrap_or(i64::MAX);
            let at = if at < 0 { at + len } else { at };
            usize::try_from(at.clamp(0, len)).map_err(|_| out_of_range(method))
        };
        match (method, args) {
            ("append", [value]) => items.push(value.clone()),
            ("extend", [_]) => items.extend(extension.unwrap_or_default()),
            ("insert", [at, value]) => {
                let at = index(at, items.len())?;
                items.insert(at, value.clone());
            }
            ("pop", [] | [_]) => {
                if items.is_empty() {
                    return Err(out_of_range(method));
                }
                let last = items.len() - 1;
                let at = match args.first() {
                    Some(at) => index(at, items.len())?,
                    None => last,
                };
                if at > last {
                    return Err(out_of_range(method));
                }
                return Ok(items.remove(at));
            }
            ("clear", []) => items.clear(),
            _ => {
                return Err(Error::new(
                    ErrorKind::UnknownMethod,
                    format!(
                        "a list has no method {method} taking {} arguments",
                        args.len()
                    ),
                ));
            }
        }
        Ok(Value::from(()))
    }
}

fn out_of_range(method: &str) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("{method}: index out of range"),
    )
}

/// The fuel a render spends on what our filters write and visit, charged
/// as the text grows: a short value can print as gigabytes (a list holding
/// one long string many times, or a lazily doubled list), so the charge
/// must come before the memory does.
pub(crate) struct Meter<'a, 't, 'e> {
    state: &'a State<'t, 'e>,
    /// How much of the text written so far is paid for.
    charged: usize,
}

/// The bytes one unit of minijinja's fuel pays for.
pub(crate) const BYTES_PER_FUEL: usize = 64;

/// The fuel of visiting one item: an item of a lazily concatenated list
/// costs a step per concatenation it sits under.
const FUEL_PER_ITEM: u64 = 4;

impl<'a, 't, 'e> Meter<'a, 't, 'e> {
    pub(crate) fn new(state: &'a State<'t, 'e>) -> Self {
        Self { state, charged: 0 }
    }

    /// Charges one item visited and the text `out` gained since the last
    /// charge; fails once the render's fuel is spent.
    fn visit(&mut self, out: &str) -> Result<(), Error> {
        let unpaid = out.len().saturating_sub(self.charged) / BYTES_PER_FUEL;
        self.charged += unpaid * BYTES_PER_FUEL;
        self.state.consume_fuel(FUEL_PER_ITEM + unpaid as u64)
    }

    /// Charges a visit to a value `depth` deep in what is being printed,
    /// refusing one deeper than [`MAX_NESTING`].
    fn enter(&mut self, out: &str, depth: usize) -> Result<(), Error> {
        self.visit(out)?;
        if depth > MAX_NESTING {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("a value nested more than {MAX_NESTING} deep (one that holds itself?)"),
            ));
        }
        Ok(())
    }

    /// Pays for `bytes` about to be allocated, before they are.
    fn reserve(&self, bytes: usize) -> Result<(), Error> {
        self.state.consume_fuel((bytes / BYTES_PER_FUEL) as u64)
    }
}

/// How deep a value our filters print may nest: a list a template put in
/// itself (`ns.l.append(ns.l)`) would otherwise never end.
const MAX_NESTING: usize = 128;

/// Python's `str(value)`: a string as it is, anything else as `repr`.
pub(crate) fn str_of(value: &Value, meter: &mut Meter<'_, '_, '_>) -> Result<String, Error> {
    Ok(match value.kind() {
        ValueKind::String => value.as_str().unwrap_or_default().to_owned(),
        ValueKind::Undefined => String::new(),
        _ => {
            let mut out = String::new();
            write_repr(&mut out, value, 0, meter)?;
            out
        }
    })
}

fn write_repr(
    out: &mut String,
    value: &Value,
    depth: usize,
    meter: &mut Meter<'_, '_, '_>,
) -> Result<(), Error> {
    meter.enter(out, depth)?;
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::String => write_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Number => write_number(out, value),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &item, depth + 1, meter)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &key, depth + 1, meter)?;
                out.push_str(": ");
                write_repr(
                    out,
                    &value.get_item(&key).unwrap_or_default(),
                    depth + 1,
                    meter,
                )?;
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
    Ok(())
}

/// A string as Python quotes it: single quotes unless it holds one and no
/// double quote.
fn write_str_repr(out: &mut String, text: &str) {
    let quote = if text.contains('\'') && !text.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// A number as Python prints it: floats always with a point or exponent.
fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    match f64::try_from(value.clone()) {
        Ok(f) if f.is_nan() => out.push_str("nan"),
        Ok(f) if f.is_infinite() => out.push_str(if f > 0.0 { "inf" } else { "-inf" }),
        Ok(f) => out.push_str(&python_float(f)),
        Err(_) => {
            let _ = write!(out, "{value}");
        }
    }
}

/// `repr(float)`: the shortest round-trip digits, in Python's layout
/// (`1.0`, `0.0001`, `1e-05`, `1e+16`).
fn python_float(f: f64) -> String {
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits, as Python does.
    let scientific = format!("{f:e}");
    let (mantissa, exponent) = scientific.split_once('e').expect("{:e} has an exponent");
    let exponent: i32 = exponent.parse().expect("an integer exponent");
    if (-4..16).contains(&exponent) {
        let plain = format!("{f}");
        if plain.contains('.') {
            plain
        } else {
            format!("{plain}.0")
        }
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    }
}

/// Prints a value as Jinja under Python prints it.
pub(crate) fn formatter(
    out: &mut minijinja::Output<'_>,
    state: &mut State<'_, '_>,
    value: &Value,
) -> Result<(), Error> {
    let text = str_of(value, &mut Meter::new(state))?;
    out.write_str(&text)
        .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
}

/// `| string`: Python's `str()`.
pub(crate) fn string(state: &State<'_, '_>, value: &Value) -> Result<String, Error> {
    str_of(value, &mut Meter::new(state))
}

/// `| indent(width, first, blank)` as Jinja under Python indents: every
/// line but the first (and the first too with `first`), blank lines only
/// with `blank`; a text that ends with a newline keeps it.
// minijinja hands a filter its arguments by value.
#[allow(clippy::needless_pass_by_value)]
pub(crate) fn indent(
    state: &State<'_, '_>,
    text: &str,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> Result<String, Error> {
    let mut meter = Meter::new(state);
    let argument = |i: usize, name: &str| -> Result<Option<Value>, Error> {
        match args.get(i) {
            Some(value) => Ok(Some(value.clone())),
            None => kwargs.get::<Option<Value>>(name),
        }
    };
    let width = argument(0, "width")?;
    let first = argument(1, "first")?.is_some_and(|v| v.is_true());
    let blank = argument(2, "blank")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let indention = match width {
        None => "    ".to_owned(),
        Some(w) => match w.as_str() {
            Some(text) => text.to_owned(),
            None => spaces(usize::try_from(w)?, &meter)?,
        },
    };
    // Python's `str.splitlines` of the text with a newline added.
    let with_newline = format!("{text}\n");
    let lines: Vec<&str> = with_newline.lines().collect();
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        if i > 0 {
            out.push('\n');
            if blank || !line.is_empty() {
                out.push_str(&indention);
            }
        }
        out.push_str(line);
        meter.visit(&out)?;
    }
    if first {
        out.insert_str(0, &indention);
    }
    Ok(out)
}

/// `| length` and `| count`: an undefined value is empty, as Jinja's
/// `Undefined` is; `None` has no length, as in Python.
pub(crate) fn length(value: &Value) -> Result<usize, Error> {
    if value.is_undefined() {
        return Ok(0);
    }
    value.len().ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("object of type {} has no len()", value.kind()),
        )
    })
}

/// `| tojson`: `json.dumps(value, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, as `transformers` defines it.
// minijinja hands a filter its arguments by value.
#[allow(clippy::needless_pass_by_value)]
pub(crate) fn tojson(
    state: &State<'_, '_>,
    value: &Value,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<String, Error> {
    let indent = match indent {
        Some(indent) => Some(indent),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent: Option<String> = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(text) => Some(text.to_owned()),
            None => Some(spaces(usize::try_from(v)?, &Meter::new(state))?),
        },
    };
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "separators must be (item_separator, key_separator)",
            ));
        }
        // Python's defaults: ", " on one line, "," where an indent breaks lines.
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let style = JsonStyle {
        indent,
        item,
        key,
        ensure_ascii,
        sort_keys,
    };
    let mut out = String::new();
    style.write(&mut out, value, 0, &mut Meter::new(state))?;
    Ok(out)
}

/// `width` spaces, paid for before they are made.
fn spaces(width: usize, meter: &Meter<'_, '_, '_>) -> Result<String, Error> {
    meter.reserve(width)?;
    Ok(" ".repeat(width))
}

struct JsonStyle {
    indent: Option<String>,
    item: String,
    key: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl JsonStyle {
    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    }

    fn write(
        &self,
        out: &mut String,
        value: &Value,
        depth: usize,
        meter: &mut Meter<'_, '_, '_>,
    ) -> Result<(), Error> {
        meter.enter(out, depth)?;
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                if value.is_integer() {
                    let _ = write!(out, "{value}");
                } else {
                    match f64::try_from(value.clone()) {
                        Ok(f) if f.is_nan() => out.push_str("NaN"),
                        Ok(f) if f.is_infinite() => {
                            out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
                        }
                        Ok(f) => out.push_str(&python_float(f)),
                        Err(_) => {
                            let _ = write!(out, "{value}");
                        }
                    }
                }
            }
            ValueKind::String => self.write_string(out, value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                // Walked as it comes: a lazy list can be far longer than memory.
                let mut items = value.try_iter()?.peekable();
                if items.peek().is_none() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(out, depth + 1);
                    self.write(out, &item, depth + 1, meter)?;
                }
                self.newline(out, depth);
                out.push(']');
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                out.push('{');
                for (i, key) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(out, depth + 1);
                    match key.as_str() {
                        Some(text) => self.write_string(out, text),
                        // json.dumps turns other keys into strings.
                        None => self.write_string(out, &json_key(key)),
                    }
                    out.push_str(&self.key);
                    self.write(out, &value.get_item(key)?, depth + 1, meter)?;
                }
                self.newline(out, depth);
                out.push('}');
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("Object of type {} is not JSON serializable", value.kind()),
                ));
            }
        }
        Ok(())
    }

    fn write_string(&self, out: &mut String, text: &str) {
        out.push('"');
        for c in text.chars() {
            match c {
                c if self.ensure_ascii && !c.is_ascii() => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => crate::open_calls::push_escaped(out, c),
            }
        }
        out.push('"');
    }
}

/// A map key that is not a string, as `json.dumps` names it.
fn json_key(key: &Value) -> String {
    match key.kind() {
        ValueKind::None => "null".into(),
        ValueKind::Bool => if key.is_true() { "true" } else { "false" }.into(),
        _ => key.to_string(),
    }
}

/// Python's string methods that minijinja-contrib's pycompat leaves out,
/// then pycompat's own.
pub(crate) fn unknown_method(
    state: &mut State<'_, '_>,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(text) = value.as_str() {
        let arg = |i: usize| args.get(i).and_then(Value::as_str);
        match (method, args.len()) {
            ("rsplit", 0..=2) => {
                let limit = match args.get(1) {
                    Some(v) => usize::try_from(v.clone()).ok(),
                    None => None,
                };
                let parts: Vec<Value> = match (arg(0), limit) {
                    (Some(sep), Some(limit)) => {
                        let mut parts: Vec<&str> = text.rsplitn(limit + 1, sep).collect();
                        parts.reverse();
                        parts.into_iter().map(Value::from).collect()
                    }
                    (Some(sep), None) => text.split(sep).map(Value::from).collect(),
                    (None, _) => text.split_whitespace().map(Value::from).collect(),
                };
                return Ok(Value::from(parts));
            }
            ("removeprefix", 1) => {
                let prefix = arg(0).unwrap_or_default();
                return Ok(Value::from(text.strip_prefix(prefix).unwrap_or(text)));
            }
            ("removesuffix", 1) => {
                let suffix = arg(0).unwrap_or_default();
                return Ok(Value::from(text.strip_suffix(suffix).unwrap_or(text)));
            }
            ("partition" | "rpartition", 1) => {
                let sep = arg(0).unwrap_or_default();
                let split = if method == "partition" {
                    text.split_once(sep)
                } else {
                    text.rsplit_once(sep)
                };
                let parts = match split {
                    Some((before, after)) => [before, sep, after],
                    None if method == "partition" => [text, "", ""],
                    None => ["", "", text],
                };
                return Ok(Value::from(
                    parts.into_iter().map(Value::from).collect::<Vec<_>>(),
                ));
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(json: &str) -> Value {
        serde_json::from_str(json).unwrap()
    }

    /// `source` rendered as chat templates are, with `v` bound to `value`.
    fn render(source: &str, value: &Value) -> Result<String, Error> {
        let mut env = minijinja::Environment::new();
        env.set_fuel(Some(100_000));
        behave_as_python(&mut env);
        env.render_str(source, minijinja::context! { v => value })
    }

    #[test]
    fn values_print_as_python_prints_them() {
        let printed = |json: &str| render("{{ v }}|{{ v|string }}", &value(json)).unwrap();
        assert_eq!(
            printed(r#"{"a": [1, 2.5, true, null, "it's"], "b": "x"}"#),
            r#"{'a': [1, 2.5, True, None, "it's"], 'b': 'x'}|{'a': [1, 2.5, True, None, "it's"], 'b': 'x'}"#
        );
        assert_eq!(printed("\"plain\""), "plain|plain");
        assert_eq!(python_float(1.0), "1.0");
        assert_eq!(python_float(1e-5), "1e-05");
        assert_eq!(python_float(1e16), "1e+16");
        assert_eq!(python_float(0.1), "0.1");
    }

    #[test]
    fn indent_keeps_a_final_newline_as_python_does() {
        let indent = |text: &str, arguments: &str| {
            render(
                &format!("{{{{ v|indent({arguments}) }}}}"),
                &Value::from(text),
            )
            .unwrap()
        };
        assert_eq!(indent("{\n", "4, first=true"), "    {\n");
        assert_eq!(indent("a\n\nb", "2"), "a\n\n  b");
        assert_eq!(indent("a\n\nb", "2, false, true"), "a\n  \n  b");
    }

    #[test]
    fn printing_costs_fuel_as_it_grows_and_ends() {
        // A list holding one string a thousand times prints as 100 MB; a
        // list holding itself never ends; a width can ask for any memory.
        let many = "{% set s = 'x' * 100000 %}{% set ns = namespace(l=[s]) %}\
                    {% for i in range(10) %}{{ ns.l.extend(ns.l) or '' }}{% endfor %}";
        for printed in ["{{ ns.l }}", "{{ ns.l|string }}", "{{ ns.l|tojson }}"] {
            let error = render(&format!("{many}{printed}"), &Value::UNDEFINED).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::OutOfFuel, "{printed}: {error}");
        }
        let itself = "{% set ns = namespace(l=[1]) %}{{ ns.l.append(ns.l) or '' }}";
        for printed in ["{{ ns.l }}", "{{ ns.l|tojson }}"] {
            let error = render(&format!("{itself}{printed}"), &Value::UNDEFINED).unwrap_err();
            assert!(error.to_string().contains("nested more than"), "{error}");
        }
        for wide in [
            "{{ 'a\nb'|indent(10**12) }}",
            "{{ v|tojson(indent=10**12) }}",
        ] {
            let error = render(wide, &value("[1]")).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::OutOfFuel, "{wide}: {error}");
        }
    }

    #[test]
    fn tojson_is_json_dumps() {
        let v = value(r#"{"b": 1, "a": {"x": [1, "é"]}, "c": []}"#);
        let dumps =
            |arguments: &str| render(&format!("{{{{ v|tojson({arguments}) }}}}"), &v).unwrap();
        assert_eq!(dumps(""), r#"{"b": 1, "a": {"x": [1, "é"]}, "c": []}"#);
        assert_eq!(
            dumps("indent=2"),
            "{\n  \"b\": 1,\n  \"a\": {\n    \"x\": [\n      1,\n      \"é\"\n    ]\n  },\n  \"c\": []\n}"
        );
        assert_eq!(
            dumps("ensure_ascii=true, sort_keys=true, separators=[',', ':']"),
            r#"{"a":{"x":[1,"\u00e9"]},"b":1,"c":[]}"#
        );
    }
}
