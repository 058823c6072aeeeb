//! JSON Schema → GBNF, in the manner of llama.cpp's
//! `json-schema-to-grammar`: one rule per schema node, shared primitive rules,
//! objects with their properties in declared order.

use std::collections::{BTreeSet, HashMap};
use std::fmt;

use serde_json::{Map, Value};

use crate::limits::{
    MAX_ENUM_VALUES, MAX_REPETITIONS, MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES, MAX_WAYS_AT_ONCE,
};

/// A schema that cannot be compiled: where in it, and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SchemaError {
    /// Dotted path of the offending node from the schema's root (`""` for
    /// the root itself), e.g. `properties.tags.items`.
    pub path: String,
    /// What is wrong there.
    pub message: String,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "schema: {}", self.message)
        } else {
            write!(f, "schema at {}: {}", self.path, self.message)
        }
    }
}

/// Whitespace between tokens: none, a space, or a newline and a bounded
/// indent (bounded so that a model cannot spend its tokens on blanks).
const SPACE: &str = r#"| " " | "\n" [ \t]{0,20}"#;

/// Whitespace between the tokens of a call (a [`sequence`]): none or one
/// space, on one line, as models write calls: at most one character a
/// token, so even a model with nothing to say (random weights) ends a call
/// whose strings are bounded within a few dozen tokens.
const COMPACT_SPACE: &str = r#"| " ""#;

/// The shared primitive rules, each with the rules it uses.
const PRIMITIVES: &[(&str, &str, &[&str])] = &[
    ("space", SPACE, &[]),
    ("boolean", r#"("true" | "false") space"#, &["space"]),
    ("null", r#""null" space"#, &["space"]),
    (
        "char",
        r#"[^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4})"#,
        &[],
    ),
    ("string", r#""\"" char* "\"" space"#, &["char", "space"]),
    ("integral-part", "[0] | [1-9] [0-9]{0,15}", &[]),
    ("decimal-part", "[0-9]{1,16}", &[]),
    (
        "number",
        // An exponent of two digits at most: with 16 digits on either side of
        // the point every number stays finite in a double (JSON sets no
        // bound, but the parsers that read it do: 1E+3087 is out of range).
        r#"("-"? integral-part) ("." decimal-part)? ([eE] [-+]? [0-9]{1,2})? space"#,
        &["integral-part", "decimal-part", "space"],
    ),
    (
        "integer",
        r#"("-"? integral-part) space"#,
        &["integral-part", "space"],
    ),
    (
        "value",
        "object | array | string | number | boolean | null",
        &["object", "array", "string", "number", "boolean", "null"],
    ),
    (
        "object",
        r#""{" space ( string ":" space value ("," space string ":" space value)* )? "}" space"#,
        &["string", "value", "space"],
    ),
    (
        "array",
        r#""[" space ( value ("," space value)* )? "]" space"#,
        &["value", "space"],
    ),
    (
        "date",
        r#"[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )"#,
        &[],
    ),
    (
        "time",
        r#"( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )"#,
        &[],
    ),
    (
        "uuid",
        r#"[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}"#,
        &[],
    ),
];

/// String formats the grammar enforces, with the rule of their content.
const FORMATS: &[(&str, &str)] = &[
    ("date", "date"),
    ("time", "time"),
    ("date-time", r#"date "T" time"#),
    ("uuid", "uuid"),
];

/// Keywords that only describe (or that other keywords already cover).
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "$schema",
    "$id",
    "$comment",
    "$defs",
    "definitions",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentEncoding",
    "contentMediaType",
    "nullable",
];

/// Keywords that constrain values in ways a grammar here does not enforce,
/// with what they are.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("pattern", "a regular expression constraint"),
    ("patternProperties", "property names by regular expression"),
    ("propertyNames", "a constraint on property names"),
    ("minProperties", "a count of properties"),
    ("maxProperties", "a count of properties"),
    ("multipleOf", "a numeric constraint"),
    ("maximum", "a numeric range"),
    ("exclusiveMaximum", "a numeric range"),
    ("uniqueItems", "distinct array items"),
    ("contains", "an array constraint"),
    ("minContains", "an array constraint"),
    ("maxContains", "an array constraint"),
    ("not", "a negated schema"),
    ("if", "a conditional schema"),
    ("then", "a conditional schema"),
    ("else", "a conditional schema"),
    ("allOf", "an intersection of schemas"),
    ("dependentRequired", "a conditional requirement"),
    ("dependentSchemas", "a conditional schema"),
    ("dependencies", "a conditional requirement"),
    ("unevaluatedProperties", "a constraint on properties"),
    ("unevaluatedItems", "a constraint on items"),
    ("$dynamicRef", "a dynamic reference"),
];

/// The grammar of any JSON object (OpenAI's `json_object` mode).
///
/// ```
/// let grammar = cortex_grammar::json_object();
/// cortex_grammar::check(&grammar).unwrap();
/// ```
pub fn json_object() -> String {
    let mut converter = Converter::new(&Value::Null);
    converter.primitive("object");
    converter.finish("object")
}

/// Compiles `schema` (a JSON Schema) into a GBNF grammar whose `root` rule
/// matches exactly JSON documents valid against it (with optional
/// whitespace, and properties in the order the schema declares them).
///
/// Refused, naming the keyword and where it is: constraints a grammar here
/// does not enforce ([`UNSUPPORTED`]), unknown `type`s and `format`s, `$ref`s
/// outside the document, `required` names that are not properties, schemas
/// that allow nothing, and schemas past the bounds of [`crate::limits`]
/// (nesting, size, counts above llama.cpp's repetition limit, or a grammar
/// that [`crate::check`] refuses).
pub fn from_json_schema(schema: &Value) -> Result<String, SchemaError> {
    let mut converter = Converter::new(schema);
    let root = converter.visit(schema, "root", "")?;
    let grammar = converter.finish(&root);
    crate::check(&grammar).map_err(|e| SchemaError {
        path: String::new(),
        message: format!(
            "it compiles to a grammar past cortex's limits: {}",
            e.message
        ),
    })?;
    Ok(grammar)
}

/// One part of a [`sequence`].
#[derive(Debug, Clone)]
pub enum Part<'a> {
    /// This text, exactly.
    Text(&'a str),
    /// A JSON document valid against this schema (compiled as
    /// [`from_json_schema`] compiles it).
    Json(&'a Value),
    /// Any one of these sequences.
    OneOf(Vec<Vec<Part<'a>>>),
    /// A GBNF expression written by the caller (`[a-zA-Z0-9]{9}`), which
    /// [`check`](crate::check) then checks with the rest.
    Expression(&'a str),
}

/// The grammar of `parts` one after the other: how a model's markers frame
/// JSON (a function call as `<tool_call>` JSON `</tool_call>`, or a name,
/// `[ARGS]` and its arguments), with the same refusals and limits as
/// [`from_json_schema`], and JSON written on one line (at most one space
/// between tokens).
///
/// ```
/// use cortex_grammar::Part;
/// use serde_json::json;
///
/// let arguments = json!({"type": "object", "properties": {"city": {"type": "string"}}});
/// let grammar = cortex_grammar::sequence(&[
///     Part::Text("[TOOL_CALLS]"),
///     Part::OneOf(vec![vec![Part::Text("weather[ARGS]"), Part::Json(&arguments)]]),
/// ])
/// .unwrap();
/// assert!(grammar.starts_with(r#"root ::= "[TOOL_CALLS]" ( "weather[ARGS]" "#));
/// cortex_grammar::check(&grammar).unwrap();
/// ```
pub fn sequence(parts: &[Part<'_>]) -> Result<String, SchemaError> {
    let mut converter = Converter::new(&Value::Null);
    converter.space = COMPACT_SPACE;
    let root = converter.parts(parts, "")?;
    let grammar = converter.finish(&root);
    crate::check(&grammar).map_err(|e| SchemaError {
        path: String::new(),
        message: format!(
            "it compiles to a grammar past cortex's limits: {}",
            e.message
        ),
    })?;
    Ok(grammar)
}

struct Converter<'a> {
    document: &'a Value,
    /// Rule name → body, in the order they were made.
    rules: Vec<(String, String)>,
    names: BTreeSet<String>,
    /// Name base → the next number to try after it, so that making names
    /// stays linear however many share a base.
    next_suffix: HashMap<String, usize>,
    /// Rule body → the rule made for it: the same body is one rule.
    bodies: HashMap<String, String>,
    /// `$ref` → the rule made for it (made before it is visited, so that
    /// recursive schemas end).
    refs: HashMap<String, String>,
    /// Schema nodes being visited, one inside the other (`$ref`s included).
    depth: usize,
    /// Schema nodes visited so far.
    nodes: usize,
    /// The body of the `space` rule.
    space: &'static str,
}

impl<'a> Converter<'a> {
    fn new(document: &'a Value) -> Self {
        Self {
            document,
            rules: Vec::new(),
            // `root` is the line `finish` writes.
            names: BTreeSet::from(["root".to_owned()]),
            next_suffix: HashMap::new(),
            bodies: HashMap::new(),
            refs: HashMap::new(),
            depth: 0,
            nodes: 0,
            space: SPACE,
        }
    }

    /// The expression of `parts` in sequence; each schema is its own
    /// document (its `$ref`s resolve inside it).
    fn parts(&mut self, parts: &[Part<'a>], path: &str) -> Result<String, SchemaError> {
        let mut out = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            let at = format!("{path}[{i}]");
            out.push(match part {
                Part::Text(text) => literal_text(text),
                Part::Expression(expression) => format!("( {expression} )"),
                Part::Json(schema) => {
                    self.document = schema;
                    self.refs.clear();
                    self.visit(schema, "json", &at)?
                }
                Part::OneOf(choices) => {
                    let choices = choices
                        .iter()
                        .enumerate()
                        .map(|(j, choice)| self.parts(choice, &format!("{at}[{j}]")))
                        .collect::<Result<Vec<_>, _>>()?;
                    format!("( {} )", choices.join(" | "))
                }
            });
        }
        Ok(if out.is_empty() {
            "\"\"".into()
        } else {
            out.join(" ")
        })
    }

    /// The grammar: `root ::= <root>` first, then every rule made.
    fn finish(self, root: &str) -> String {
        let mut out = format!("root ::= {root}\n");
        for (name, body) in &self.rules {
            out.push_str(&format!("{name} ::= {body}\n"));
        }
        out
    }

    /// Adds primitive `name` and those it uses (once each).
    fn primitive(&mut self, name: &str) -> String {
        if !self.names.contains(name) {
            let (_, body, uses) = PRIMITIVES
                .iter()
                .find(|(n, _, _)| *n == name)
                .expect("a known primitive");
            let body = if name == "space" { self.space } else { body };
            self.names.insert(name.to_owned());
            self.rules.push((name.to_owned(), (*body).to_owned()));
            for used in *uses {
                self.primitive(used);
            }
        }
        name.to_owned()
    }

    /// A fresh rule name from `hint` (letters, digits and dashes).
    fn fresh_name(&mut self, hint: &str) -> String {
        let mut base: String = hint
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        base = base.trim_matches('-').to_owned();
        if base.is_empty() || PRIMITIVES.iter().any(|(n, _, _)| *n == base) {
            base = format!("{base}-node").trim_start_matches('-').to_owned();
        }
        let mut name = base.clone();
        let next = self.next_suffix.entry(base.clone()).or_insert(1);
        while self.names.contains(&name) {
            name = format!("{base}-{next}");
            *next += 1;
        }
        self.names.insert(name.clone());
        name
    }

    /// Adds rule `body` under a name from `hint` (or finds the rule that
    /// has that body already); returns the name.
    fn rule(&mut self, hint: &str, body: String) -> String {
        if let Some(name) = self.bodies.get(&body) {
            return name.clone();
        }
        let name = self.fresh_name(hint);
        self.bodies.insert(body.clone(), name.clone());
        self.rules.push((name.clone(), body));
        name
    }

    /// The alternatives matching exactly one of `texts`, as a prefix tree:
    /// a common beginning is written once, so the ways llama.cpp keeps at
    /// any point are the distinct next characters rather than every text.
    /// Each branching point is a rule (none nests in another); built with a
    /// list of work rather than recursion.
    fn prefix_tree(&mut self, hint: &str, mut texts: Vec<Vec<char>>) -> String {
        texts.sort_unstable();
        texts.dedup();
        let mut top = String::new();
        // (the rule slot to fill, or none for the top; texts[lo..hi], which
        // share their first `depth` characters)
        let mut work: Vec<(Option<usize>, usize, usize, usize)> = vec![(None, 0, texts.len(), 0)];
        while let Some((slot, lo, hi, depth)) = work.pop() {
            let mut alternatives = Vec::new();
            let mut i = lo;
            if texts[i].len() == depth {
                // Sorted: a text that ends here comes first.
                alternatives.push(String::new());
                i += 1;
            }
            while i < hi {
                let next = texts[i][depth];
                let j = i + texts[i..hi].partition_point(|t| t[depth] == next);
                let (first, last) = (&texts[i], &texts[j - 1]);
                let mut end = depth + 1;
                while end < first.len() && end < last.len() && first[end] == last[end] {
                    end += 1;
                }
                let label = literal_text(&first[depth..end].iter().collect::<String>());
                if j - i == 1 {
                    alternatives.push(label);
                } else {
                    let name = self.fresh_name(&format!("{hint}-tree"));
                    self.rules.push((name.clone(), String::new()));
                    work.push((Some(self.rules.len() - 1), i, j, end));
                    alternatives.push(format!("{label} {name}"));
                }
                i = j;
            }
            let body = alternatives.join(" | ");
            match slot {
                Some(slot) => self.rules[slot].1 = body,
                None => top = body,
            }
        }
        top
    }

    /// The expression matching values of `schema`; `hint` names its rules,
    /// `path` locates it for errors. Bounded in depth and in nodes.
    fn visit(&mut self, schema: &Value, hint: &str, path: &str) -> Result<String, SchemaError> {
        self.nodes += 1;
        if self.nodes > MAX_SCHEMA_NODES {
            return Err(SchemaError {
                path: path.to_owned(),
                message: format!(
                    "the schema has more than {MAX_SCHEMA_NODES} nodes (counting each $ref once); make it smaller"
                ),
            });
        }
        if self.depth >= MAX_SCHEMA_DEPTH {
            return Err(SchemaError {
                path: path.to_owned(),
                message: format!(
                    "the schema nests deeper than {MAX_SCHEMA_DEPTH} levels (counting each $ref followed)"
                ),
            });
        }
        self.depth += 1;
        let expression = self.node(schema, hint, path);
        self.depth -= 1;
        expression
    }

    fn node(&mut self, schema: &Value, hint: &str, path: &str) -> Result<String, SchemaError> {
        let error = |message: String| SchemaError {
            path: path.to_owned(),
            message,
        };
        let node = match schema {
            Value::Bool(true) => return Ok(self.primitive("value")),
            Value::Bool(false) => return Err(error("a false schema allows no value".into())),
            Value::Object(node) => node,
            other => {
                return Err(error(format!(
                    "expected a schema (an object or a boolean), not {other}"
                )));
            }
        };
        if let Some((keyword, what)) = UNSUPPORTED.iter().find(|(k, _)| node.contains_key(*k)) {
            return Err(error(format!("{keyword} is not supported ({what})")));
        }
        if let Some(reference) = node.get("$ref") {
            return self.reference(reference, path);
        }
        if node.contains_key("const") || node.contains_key("enum") {
            self.primitive("space");
        }
        if let Some(value) = node.get("const") {
            return Ok(self.rule(hint, literal(value)));
        }
        if let Some(values) = node.get("enum") {
            let Value::Array(values) = values else {
                return Err(error("enum must be an array".into()));
            };
            if values.is_empty() {
                return Err(error("an empty enum allows no value".into()));
            }
            at_most(values.len(), MAX_ENUM_VALUES, "enum", path)?;
            let texts = values
                .iter()
                .map(|v| v.to_string().chars().collect())
                .collect();
            let tree = self.prefix_tree(hint, texts);
            return Ok(self.rule(hint, format!("( {tree} ) space")));
        }
        for keyword in ["anyOf", "oneOf"] {
            if let Some(options) = node.get(keyword) {
                return self.alternatives(node, keyword, options, hint, path);
            }
        }
        let types: Vec<&str> = match node.get("type") {
            None => {
                if node.contains_key("properties") || node.contains_key("additionalProperties") {
                    vec!["object"]
                } else if node.contains_key("items") || node.contains_key("prefixItems") {
                    vec!["array"]
                } else {
                    check_keywords(node, &[], path)?;
                    return Ok(self.primitive("value"));
                }
            }
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) if !ts.is_empty() => ts
                .iter()
                .map(|t| {
                    t.as_str()
                        .ok_or_else(|| error(format!("type entries must be strings, not {t}")))
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(error(format!(
                    "type must be a string or a non-empty array, not {other}"
                )));
            }
        };
        let mut bodies = Vec::new();
        for kind in &types {
            bodies.push(self.typed(node, kind, hint, path)?);
        }
        if bodies.len() == 1 {
            Ok(bodies.pop().expect("one"))
        } else {
            Ok(self.rule(hint, bodies.join(" | ")))
        }
    }

    /// `anyOf` / `oneOf`: any of the options (sibling keywords other than
    /// annotations are refused rather than merged).
    fn alternatives(
        &mut self,
        node: &Map<String, Value>,
        keyword: &str,
        options: &Value,
        hint: &str,
        path: &str,
    ) -> Result<String, SchemaError> {
        let here = join(path, keyword);
        let Value::Array(options) = options else {
            return Err(SchemaError {
                path: here,
                message: format!("{keyword} must be an array of schemas"),
            });
        };
        if let Some(other) = node
            .keys()
            .find(|k| *k != keyword && !ANNOTATIONS.contains(&k.as_str()))
        {
            return Err(SchemaError {
                path: path.to_owned(),
                message: format!(
                    "{other} beside {keyword} is not supported; put it inside each option"
                ),
            });
        }
        if options.is_empty() {
            return Err(SchemaError {
                path: here,
                message: format!("an empty {keyword} allows no value"),
            });
        }
        at_most(options.len(), MAX_WAYS_AT_ONCE as usize, keyword, path)?;
        let mut bodies = Vec::new();
        for (i, option) in options.iter().enumerate() {
            bodies.push(self.visit(option, &format!("{hint}-{i}"), &format!("{here}.{i}"))?);
        }
        Ok(self.rule(hint, bodies.join(" | ")))
    }

    fn reference(&mut self, reference: &Value, path: &str) -> Result<String, SchemaError> {
        let error = |message: String| SchemaError {
            path: join(path, "$ref"),
            message,
        };
        let Some(target) = reference.as_str() else {
            return Err(error(format!("$ref must be a string, not {reference}")));
        };
        if let Some(name) = self.refs.get(target) {
            return Ok(name.clone());
        }
        let Some(pointer) = target.strip_prefix('#') else {
            return Err(error(format!(
                "{target:?} is outside this schema; only local references (#/$defs/...) are supported"
            )));
        };
        let Some(resolved) = self.document.pointer(pointer) else {
            return Err(error(format!(
                "{target:?} points at nothing in this schema"
            )));
        };
        let hint = if pointer.is_empty() {
            "root"
        } else {
            pointer.rsplit('/').next().unwrap_or("ref")
        };
        // Named first, so that a schema that refers to itself ends.
        let name = self.fresh_name(hint);
        self.refs.insert(target.to_owned(), name.clone());
        let slot = self.rules.len();
        self.rules.push((name.clone(), String::new()));
        let path = pointer.trim_start_matches('/').replace('/', ".");
        let body = self.visit(resolved, &name, &path)?;
        self.rules[slot].1 = body;
        Ok(name)
    }

    fn typed(
        &mut self,
        node: &Map<String, Value>,
        kind: &str,
        hint: &str,
        path: &str,
    ) -> Result<String, SchemaError> {
        match kind {
            "object" => self.object(node, hint, path),
            "array" => self.array(node, hint, path),
            "string" => self.string(node, hint, path),
            "integer" => self.integer(node, path),
            "number" => {
                check_keywords(node, &[], path)?;
                if node.contains_key("minimum") || node.contains_key("exclusiveMinimum") {
                    return Err(SchemaError {
                        path: path.to_owned(),
                        message: "minimum is not supported on numbers (a numeric range)".into(),
                    });
                }
                Ok(self.primitive("number"))
            }
            "boolean" => Ok(self.primitive("boolean")),
            "null" => Ok(self.primitive("null")),
            other => Err(SchemaError {
                path: join(path, "type"),
                message: format!(
                    "unknown type {other:?} (expected object, array, string, number, integer, boolean or null)"
                ),
            }),
        }
    }

    fn object(
        &mut self,
        node: &Map<String, Value>,
        hint: &str,
        path: &str,
    ) -> Result<String, SchemaError> {
        let empty = Map::new();
        let properties = match node.get("properties") {
            None => &empty,
            Some(Value::Object(p)) => p,
            Some(other) => {
                return Err(SchemaError {
                    path: join(path, "properties"),
                    message: format!("properties must be an object, not {other}"),
                });
            }
        };
        let required: BTreeSet<&str> = match node.get("required") {
            None => BTreeSet::new(),
            Some(Value::Array(names)) => names
                .iter()
                .map(|n| {
                    n.as_str().ok_or_else(|| SchemaError {
                        path: join(path, "required"),
                        message: format!("required must list property names, not {n}"),
                    })
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(SchemaError {
                    path: join(path, "required"),
                    message: format!("required must be an array of names, not {other}"),
                });
            }
        };
        if let Some(missing) = required.iter().find(|r| !properties.contains_key(**r)) {
            return Err(SchemaError {
                path: join(path, "required"),
                message: format!("{missing:?} is required but not among the properties"),
            });
        }
        if properties.is_empty() {
            // A map: `additionalProperties` gives its values.
            return match node.get("additionalProperties") {
                None | Some(Value::Bool(true)) => Ok(self.primitive("object")),
                Some(Value::Bool(false)) => Ok(self.rule(hint, r#""{" space "}" space"#.into())),
                Some(values) => {
                    let value = self.visit(
                        values,
                        &format!("{hint}-value"),
                        &join(path, "additionalProperties"),
                    )?;
                    let string = self.primitive("string");
                    self.primitive("space");
                    let entry = format!(r#"{string} ":" space {value}"#);
                    Ok(self.rule(
                        hint,
                        format!(r#""{{" space ( {entry} ( "," space {entry} )* )? "}}" space"#),
                    ))
                }
            };
        }
        // Properties beyond those declared are allowed by a schema without
        // `additionalProperties: false` but never needed: none are generated.
        self.primitive("space");
        let mut required_entries = Vec::new();
        let mut optional_entries = Vec::new();
        for (key, schema) in properties {
            let value = self.visit(
                schema,
                &format!("{hint}-{key}"),
                &join(&join(path, "properties"), key),
            )?;
            let entry = format!(
                r#"{} space ":" space {value}"#,
                literal_text(&json_string(key))
            );
            if required.contains(key.as_str()) {
                required_entries.push(entry);
            } else {
                optional_entries.push(entry);
            }
        }
        let mut body = String::from(r#""{" space "#);
        body.push_str(&required_entries.join(r#" "," space "#));
        if required_entries.is_empty() {
            if !optional_entries.is_empty() {
                let chain = self.optional_chain(hint, &optional_entries);
                body.push_str(&format!("( {chain} )?"));
            }
        } else {
            for entry in &optional_entries {
                body.push_str(&format!(r#" ( "," space {entry} )?"#));
            }
        }
        body.push_str(r#" "}" space"#);
        Ok(self.rule(hint, body))
    }

    fn array(
        &mut self,
        node: &Map<String, Value>,
        hint: &str,
        path: &str,
    ) -> Result<String, SchemaError> {
        self.primitive("space");
        let (min, max) = bounds(node, ["minItems", "maxItems"], path, "array")?;
        if let Some(prefix) = node.get("prefixItems") {
            let Value::Array(prefix) = prefix else {
                return Err(SchemaError {
                    path: join(path, "prefixItems"),
                    message: "prefixItems must be an array of schemas".into(),
                });
            };
            if node.get("items").is_some_and(|i| *i != Value::Bool(false)) {
                return Err(SchemaError {
                    path: join(path, "items"),
                    message: "items beside prefixItems is not supported (only a fixed tuple)"
                        .into(),
                });
            }
            if min > prefix.len() as u64 || max.is_some_and(|max| max < prefix.len() as u64) {
                return Err(SchemaError {
                    path: path.to_owned(),
                    message: "minItems/maxItems with prefixItems other than the tuple's length are not supported".into(),
                });
            }
            let mut parts = Vec::new();
            for (i, item) in prefix.iter().enumerate() {
                parts.push(self.visit(
                    item,
                    &format!("{hint}-{i}"),
                    &format!("{}.{i}", join(path, "prefixItems")),
                )?);
            }
            let body = format!(r#""[" space {} "]" space"#, parts.join(r#" "," space "#));
            return Ok(self.rule(hint, body));
        }
        let item = match node.get("items") {
            None => self.primitive("value"),
            Some(items) => self.visit(items, &format!("{hint}-item"), &join(path, "items"))?,
        };
        if max == Some(0) {
            return Ok(self.rule(hint, r#""[" space "]" space"#.into()));
        }
        // Rules rather than groups around repetitions: llama.cpp limits a
        // repeated (or optional) group by the rules made inside it, a
        // repeated rule only by its count.
        let next = self.rule(&format!("{hint}-next"), format!(r#""," space {item}"#));
        let after_first = min.max(1) - 1;
        let rest = match max {
            Some(max) => format!("{next}{{{after_first},{}}}", max - 1),
            None => format!("{next}{{{after_first},}}"),
        };
        let items = self.rule(&format!("{hint}-items"), format!("{item} {rest}"));
        let optional = if min == 0 { "?" } else { "" };
        Ok(self.rule(hint, format!(r#""[" space {items}{optional} "]" space"#)))
    }

    fn string(
        &mut self,
        node: &Map<String, Value>,
        hint: &str,
        path: &str,
    ) -> Result<String, SchemaError> {
        self.primitive("space");
        if let Some(format) = node.get("format") {
            let Some((_, rule)) = FORMATS.iter().find(|(f, _)| Some(*f) == format.as_str()) else {
                return Err(SchemaError {
                    path: join(path, "format"),
                    message: format!(
                        "format {format} is not supported (supported: date, time, date-time, uuid)"
                    ),
                });
            };
            for part in ["date", "time", "uuid"] {
                if rule.contains(part) {
                    self.primitive(part);
                }
            }
            return Ok(self.rule(hint, format!(r#""\"" {rule} "\"" space"#)));
        }
        if !node.contains_key("minLength") && !node.contains_key("maxLength") {
            return Ok(self.primitive("string"));
        }
        let (min, max) = bounds(node, ["minLength", "maxLength"], path, "string")?;
        let char = self.primitive("char");
        let repeat = match max {
            Some(max) => format!("{{{min},{max}}}"),
            None => format!("{{{min},}}"),
        };
        Ok(self.rule(hint, format!(r#""\"" {char}{repeat} "\"" space"#)))
    }

    /// Integers, with the one range a grammar expresses simply: a lower
    /// bound of 0 or 1.
    fn integer(&mut self, node: &Map<String, Value>, path: &str) -> Result<String, SchemaError> {
        let lower = match (node.get("minimum"), node.get("exclusiveMinimum")) {
            (None, None) => return Ok(self.primitive("integer")),
            (Some(m), None) => m.as_f64(),
            (None, Some(m)) => m.as_f64().map(|m| m + 1.0),
            (Some(_), Some(_)) => None,
        };
        self.primitive("space");
        match lower {
            Some(0.0) => Ok(self.rule(
                "nonnegative-integer",
                "([0] | [1-9] [0-9]{0,15}) space".into(),
            )),
            Some(1.0) => Ok(self.rule("positive-integer", "[1-9] [0-9]{0,15} space".into())),
            _ => Err(SchemaError {
                path: path.to_owned(),
                message: "minimum is supported on integers only as 0 or 1 (a numeric range)".into(),
            }),
        }
    }
}

/// Refuses `node`'s constraint keywords that none of `allowed` covers (used
/// where a node has no type, or a type that takes none).
fn check_keywords(
    node: &Map<String, Value>,
    allowed: &[&str],
    path: &str,
) -> Result<(), SchemaError> {
    const CONSTRAINTS: &[&str] = &["minLength", "maxLength", "format", "minItems", "maxItems"];
    match node
        .keys()
        .find(|k| CONSTRAINTS.contains(&k.as_str()) && !allowed.contains(&k.as_str()))
    {
        Some(keyword) => Err(SchemaError {
            path: path.to_owned(),
            message: format!("{keyword} needs a type it applies to"),
        }),
        None => Ok(()),
    }
}

impl Converter<'_> {
    /// Entries of which any non-empty subset may appear, in order,
    /// comma-separated: one alternative per first entry, each going on with
    /// a rule for "any of the later ones" (so the grammar grows linearly
    /// with the entries, as llama.cpp's converter does). The rules are
    /// written head first, so that llama.cpp's left-recursion check, which
    /// starts from each rule in the order names appear, walks the chain once
    /// rather than once from every link.
    fn optional_chain(&mut self, hint: &str, entries: &[String]) -> String {
        // later[j - 1]: any of entries[j..], each after a comma.
        let later: Vec<String> = (1..entries.len())
            .map(|_| self.fresh_name(&format!("{hint}-rest")))
            .collect();
        let tail = |from: usize| {
            later
                .get(from)
                .map_or(String::new(), |rule| format!(" {rule}"))
        };
        for (j, name) in later.iter().enumerate().map(|(i, name)| (i + 1, name)) {
            let body = format!(r#"( "," space {} )?{}"#, entries[j], tail(j));
            self.rules.push((name.clone(), body));
        }
        entries
            .iter()
            .enumerate()
            .map(|(first, entry)| format!("{entry}{}", tail(first)))
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

/// Refuses a list at `keyword` of more than `limit` entries.
fn at_most(count: usize, limit: usize, keyword: &str, path: &str) -> Result<(), SchemaError> {
    if count > limit {
        return Err(SchemaError {
            path: join(path, keyword),
            message: format!("{keyword} has {count} entries; at most {limit} are accepted"),
        });
    }
    Ok(())
}

/// A count range such as `minItems`/`maxItems` (the minimum 0 when absent);
/// refused when no `what` fits in it.
fn bounds(
    node: &Map<String, Value>,
    [min_key, max_key]: [&str; 2],
    path: &str,
    what: &str,
) -> Result<(u64, Option<u64>), SchemaError> {
    let min = count(node, min_key, path)?.unwrap_or(0);
    let max = count(node, max_key, path)?;
    // Counted by a grammar repetition (arrays count the items after the
    // first), whose limit is llama.cpp's.
    let countable = if what == "array" {
        MAX_REPETITIONS + 1
    } else {
        MAX_REPETITIONS
    };
    for (key, value) in [(min_key, Some(min)), (max_key, max)] {
        if let Some(value) = value
            && value > countable
        {
            return Err(SchemaError {
                path: join(path, key),
                message: format!(
                    "{key} = {value} is more than a grammar can count here (at most {countable}, llama.cpp's repetition limit)"
                ),
            });
        }
    }
    if max.is_some_and(|max| max < min) {
        return Err(SchemaError {
            path: path.to_owned(),
            message: format!("{max_key} is below {min_key} ({min}): no {what} fits"),
        });
    }
    Ok((min, max))
}

fn count(node: &Map<String, Value>, keyword: &str, path: &str) -> Result<Option<u64>, SchemaError> {
    match node.get(keyword) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| SchemaError {
            path: join(path, keyword),
            message: format!("{keyword} must be a non-negative integer, not {v}"),
        }),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn json_string(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

/// A GBNF literal matching `text` exactly.
fn literal_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02X}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The rule body matching `value` as compact JSON, then optional space.
fn literal(value: &Value) -> String {
    format!("{} space", literal_text(&value.to_string()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn compile(schema: &Value) -> String {
        let grammar = from_json_schema(schema).unwrap();
        crate::check(&grammar).unwrap_or_else(|e| panic!("{e}\n{grammar}"));
        grammar
    }

    #[test]
    fn objects_keep_declared_order_and_make_optional_properties_optional() {
        let grammar = compile(&json!({
            "type": "object",
            "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "boolean"}, "mid": {"type": "string"}},
            "required": ["zeta", "alpha"]
        }));
        assert!(grammar.starts_with("root ::= root-1\n"), "{grammar}");
        assert!(grammar.contains(r#""\"zeta\"" space ":" space integer "," space "\"alpha\"" space ":" space boolean ( "," space "\"mid\"" space ":" space string )?"#), "{grammar}");
    }

    #[test]
    fn all_optional_properties_form_a_chain() {
        let mut converter = Converter::new(&Value::Null);
        let chain = converter.optional_chain("o", &["a".into(), "b".into(), "c".into()]);
        assert_eq!(chain, "a o-rest | b o-rest-1 | c");
        assert_eq!(
            converter.rules,
            [
                (
                    "o-rest".to_owned(),
                    r#"( "," space b )? o-rest-1"#.to_owned()
                ),
                ("o-rest-1".to_owned(), r#"( "," space c )?"#.to_owned()),
            ]
        );
        compile(&json!({"properties": {"a": {}, "b": {"type": "null"}}}));
    }

    #[test]
    fn references_and_recursion_compile() {
        let grammar = compile(&json!({
            "$defs": {"node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["children"]}},
            "$ref": "#/$defs/node"
        }));
        assert!(grammar.contains("node ::= "), "{grammar}");
        compile(
            &json!({"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}}),
        );
    }

    #[test]
    fn enums_consts_and_type_lists_become_alternatives() {
        let grammar = compile(&json!({"enum": ["red", 2, null, {"a": "b"}]}));
        assert!(
            grammar.contains(r#"( "\"red\"" | "2" | "null" | "{\"a\":\"b\"}" ) space"#),
            "{grammar}"
        );
        // Common beginnings are written once.
        let grammar = compile(&json!({"enum": ["red", "rose", "ro", "blue"]}));
        assert!(grammar.starts_with("root ::= root-1\n"), "{grammar}");
        assert!(
            grammar.contains(r#"root-1 ::= ( "\"" root-tree ) space"#),
            "{grammar}"
        );
        assert!(
            grammar.contains(r#"root-tree ::= "blue\"" | "r" root-tree-1"#),
            "{grammar}"
        );
        assert!(
            grammar.contains(r#"root-tree-1 ::= "ed\"" | "o" root-tree-2"#),
            "{grammar}"
        );
        assert!(
            grammar.contains(r#"root-tree-2 ::= "\"" | "se\"""#),
            "{grammar}"
        );
        compile(&json!({"type": ["string", "null"], "maxLength": 3}));
        compile(&json!({"const": "fixed"}));
    }

    #[test]
    fn arrays_bound_their_counts() {
        let grammar = compile(
            &json!({"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 4}),
        );
        assert!(
            grammar.contains(r#"root-1 ::= "[" space root-items "]" space"#),
            "{grammar}"
        );
        assert!(
            grammar.contains("root-items ::= number root-next{1,3}"),
            "{grammar}"
        );
        assert!(
            grammar.contains(r#"root-next ::= "," space number"#),
            "{grammar}"
        );
        compile(
            &json!({"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}}}, "maxItems": 2001}),
        );
        compile(&json!({"type": "array", "maxItems": 0}));
        compile(
            &json!({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer", "minimum": 0}]}),
        );
    }

    #[test]
    fn what_cannot_be_enforced_is_refused_with_its_path() {
        let refused = |schema: Value| from_json_schema(&schema).unwrap_err().to_string();
        assert_eq!(
            refused(
                json!({"type": "object", "properties": {"n": {"type": "number", "maximum": 3}}})
            ),
            "schema at properties.n: maximum is not supported (a numeric range)"
        );
        assert_eq!(
            refused(json!({"type": "array", "items": {"type": "string", "format": "email"}})),
            r#"schema at items.format: format "email" is not supported (supported: date, time, date-time, uuid)"#
        );
        assert_eq!(
            refused(json!({"type": "object", "properties": {"a": {}}, "required": ["b"]})),
            r#"schema at required: "b" is required but not among the properties"#
        );
        assert_eq!(
            refused(json!({"$ref": "https://example.invalid/s.json"})),
            r#"schema at $ref: "https://example.invalid/s.json" is outside this schema; only local references (#/$defs/...) are supported"#
        );
        assert_eq!(
            refused(json!({"type": "decimal"})),
            r#"schema at type: unknown type "decimal" (expected object, array, string, number, integer, boolean or null)"#
        );
        assert_eq!(
            refused(json!({"allOf": [{}]})),
            "schema: allOf is not supported (an intersection of schemas)"
        );
        assert_eq!(
            refused(json!(false)),
            "schema: a false schema allows no value"
        );
    }

    /// Compiles `schema` on a small stack, so a conversion that recursed
    /// without a bound would overflow it.
    fn on_small_stack(schema: Value) -> Result<String, String> {
        crate::testing::on_small_stack(move || from_json_schema(&schema).map_err(|e| e.to_string()))
    }

    #[test]
    fn hostile_schemas_are_refused_within_bounds() {
        // A chain of 20,000 $refs, each to the next.
        assert_eq!(
            on_small_stack(crate::testing::ref_chain(20_000)).unwrap_err(),
            "schema at $defs.d63: the schema nests deeper than 64 levels (counting each $ref followed)"
        );
        // Nesting built in memory (text is already cut at 128 levels by
        // serde_json's parser).
        let mut deep = json!({"type": "string"});
        for _ in 0..1_000 {
            deep = json!({"type": "array", "items": deep});
        }
        let refused = on_small_stack(deep).unwrap_err();
        assert!(
            refused
                .ends_with("the schema nests deeper than 64 levels (counting each $ref followed)"),
            "{refused}"
        );
        // Many nodes.
        let wide: Map<String, Value> = (0..20_000)
            .map(|i| (format!("p{i}"), json!({"type": "integer", "minimum": 0})))
            .collect();
        let refused = on_small_stack(json!({"type": "object", "properties": wide})).unwrap_err();
        assert!(
            refused.ends_with(
                "the schema has more than 10000 nodes (counting each $ref once); make it smaller"
            ),
            "{refused}"
        );
        // Counts beyond llama.cpp's repetitions, and too many alternatives.
        assert_eq!(
            on_small_stack(json!({"type": "string", "maxLength": 5000})).unwrap_err(),
            "schema at maxLength: maxLength = 5000 is more than a grammar can count here (at most 2000, llama.cpp's repetition limit)"
        );
        let values: Vec<Value> = (0..5000).map(|i| json!(i)).collect();
        assert_eq!(
            on_small_stack(json!({"enum": values})).unwrap_err(),
            "schema at enum: enum has 5000 entries; at most 4096 are accepted"
        );
        // Too many optional properties to chain before any text.
        let optional: Map<String, Value> =
            (0..1_100).map(|i| (format!("p{i}"), json!({}))).collect();
        let refused =
            on_small_stack(json!({"type": "object", "properties": optional})).unwrap_err();
        assert!(
            refused.contains("enters a chain of more than 1024 rules"),
            "{refused}"
        );
    }

    #[test]
    fn large_schemas_within_the_limits_compile() {
        // 1,500 required properties, each a $ref to a definition named x:
        // names that share a base are made in linear time.
        let defs: Map<String, Value> = (0..1_500)
            .map(|i| {
                (
                    format!("g{i}"),
                    json!({"x": {"type": "integer", "minimum": 0}}),
                )
            })
            .collect();
        let properties: Map<String, Value> = (0..1_500)
            .map(|i| (format!("p{i}"), json!({"$ref": format!("#/$defs/g{i}/x")})))
            .collect();
        let required: Vec<String> = properties.keys().cloned().collect();
        let grammar = on_small_stack(json!({"$defs": defs, "type": "object",
            "properties": properties, "required": required}))
        .unwrap();
        assert!(
            grammar.contains("\nx-1499 ::= nonnegative-integer\n"),
            "{grammar}"
        );
        // One rule for every definition's identical value.
        assert_eq!(
            grammar.matches("nonnegative-integer ::=").count(),
            1,
            "{grammar}"
        );
        let labels: Vec<Value> = (0..4096).map(|i| json!(format!("label-{i}"))).collect();
        on_small_stack(json!({"enum": labels})).unwrap();
        let optional: Map<String, Value> = (0..200).map(|i| (format!("p{i}"), json!({}))).collect();
        on_small_stack(json!({"type": "object", "properties": optional})).unwrap();
        // Any of 300 optional properties may come first: 300 ways.
        let optional: Map<String, Value> = (0..300).map(|i| (format!("p{i}"), json!({}))).collect();
        let refused =
            on_small_stack(json!({"type": "object", "properties": optional})).unwrap_err();
        assert!(
            refused.contains("can go on in more than 256 ways at one point"),
            "{refused}"
        );
        compile(&json!({"type": "string", "minLength": 2000, "maxLength": 2000}));
        compile(&json!({"type": "array", "minItems": 2001, "maxItems": 2001}));
    }

    #[test]
    fn numbers_stay_within_a_double() {
        let grammar = compile(&json!({"type": "number"}));
        assert!(grammar.contains(r#"([eE] [-+]? [0-9]{1,2})?"#), "{grammar}");
    }

    #[test]
    fn json_object_mode_is_any_object() {
        let grammar = json_object();
        assert!(grammar.starts_with("root ::= object\n"), "{grammar}");
    }
}
