//! Structured outputs through the `cortex` binary and the real model: every
//! output of a `json_schema` line parses and validates against its schema
//! (checked by an independent JSON Schema validator), `json_object` and GBNF
//! lines match, and a schema that cannot be enforced is refused at submit
//! with its line number.

use std::sync::Mutex;

use cortex_tests::{Cortex, read_jsonl};
use serde_json::{Value, json};

static TURN: Mutex<()> = Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Schemas of the kinds people extract with: nested objects, arrays with
/// bounds, enums, nullable fields, numbers, dates, a recursive definition.
fn schemas() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        (
            "person",
            "Extract the person: Maria Lopez is 34 years old, reach her at maria@example.com.",
            json!({"type": "object", "properties": {
                "name": {"type": "string", "maxLength": 40},
                "age": {"type": "integer", "minimum": 0},
                "email": {"type": ["string", "null"], "maxLength": 60}},
                "required": ["name", "age", "email"], "additionalProperties": false}),
        ),
        (
            "order",
            "Turn this into an order: order 1182, two widgets (W-1) at 3.50 each and one gadget (G-7) at 12.",
            json!({"type": "object", "properties": {
                "id": {"type": "integer"},
                "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                    "type": "object", "properties": {
                        "sku": {"type": "string", "maxLength": 12},
                        "qty": {"type": "integer", "minimum": 1},
                        "price": {"type": "number"}},
                    "required": ["sku", "qty", "price"], "additionalProperties": false}},
                "status": {"enum": ["pending", "shipped", "delivered"]}},
                "required": ["id", "items", "status"], "additionalProperties": false}),
        ),
        (
            "review",
            "Analyse this review: The blender is powerful and quiet, but the lid cracked after a week.",
            json!({"type": "object", "properties": {
                "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]},
                "score": {"type": "number"},
                "keywords": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4},
                "summary": {"type": "object", "properties": {
                    "title": {"type": "string", "maxLength": 30},
                    "verified": {"type": "boolean"}},
                    "required": ["title", "verified"], "additionalProperties": false}},
                "required": ["sentiment", "score", "keywords", "summary"], "additionalProperties": false}),
        ),
        (
            "event",
            "The team meets on 2024-05-17 in room B; Ana and Tom attend, Tom leads.",
            json!({"type": "object", "$defs": {
                "attendee": {"type": "object", "properties": {
                    "name": {"type": "string", "maxLength": 20},
                    "role": {"anyOf": [{"const": "lead"}, {"type": "null"}]}},
                    "required": ["name", "role"], "additionalProperties": false}},
                "properties": {
                    "date": {"type": "string", "format": "date"},
                    "room": {"type": "string", "maxLength": 10},
                    "attendees": {"type": "array", "items": {"$ref": "#/$defs/attendee"}, "maxItems": 3},
                    "note": {"type": "string", "maxLength": 30}},
                "required": ["date", "room", "attendees"], "additionalProperties": false}),
        ),
    ]
}

#[test]
fn every_json_schema_output_parses_and_validates() {
    let _turn = turn();
    let cortex = Cortex::new();
    let schemas = schemas();
    let items = 200;
    let mut input = String::new();
    for i in 0..items {
        let (name, prompt, schema) = &schemas[i % schemas.len()];
        let mut body = json!({
            "messages": [{"role": "system", "content": "Reply with JSON only."},
                         {"role": "user", "content": prompt}],
            "max_tokens": 400,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": name, "strict": true, "schema": schema}},
        });
        // Greedy and sampled draws, several completions, and log
        // probabilities (which mask before the draw) all stay in the schema.
        match i % 5 {
            0 => body["temperature"] = json!(0),
            1 => body["n"] = json!(2),
            2 => {
                body["logprobs"] = json!(true);
                body["top_logprobs"] = json!(2);
            }
            _ => {}
        }
        body["seed"] = json!(i);
        let line = json!({"custom_id": format!("s-{i:03}"), "method": "POST",
                          "url": "/v1/chat/completions", "body": body});
        input.push_str(&format!("{line}\n"));
    }
    cortex.write("s.jsonl", &input);
    cortex.ok(&["submit", "s.jsonl"]);
    cortex.ok(&["worker"]);
    cortex.ok(&["results", "1", "-o", "out.jsonl", "--errors", "err.jsonl"]);
    assert!(read_jsonl(&cortex.dir().join("err.jsonl")).is_empty());
    let lines = read_jsonl(&cortex.dir().join("out.jsonl"));
    assert_eq!(lines.len(), items);

    let validators: Vec<jsonschema::Validator> = schemas
        .iter()
        .map(|(_, _, schema)| jsonschema::validator_for(schema).unwrap())
        .collect();
    let mut outputs = 0;
    for (i, line) in lines.iter().enumerate() {
        let choices = line["response"]["body"]["choices"].as_array().unwrap();
        assert_eq!(choices.len(), if i % 5 == 1 { 2 } else { 1 }, "{line}");
        for choice in choices {
            let content = choice["message"]["content"].as_str().unwrap();
            assert_eq!(choice["finish_reason"], "stop", "{line}");
            let value: Value = serde_json::from_str(content)
                .unwrap_or_else(|e| panic!("line {i}: not JSON ({e}): {content}"));
            if let Err(error) = validators[i % schemas.len()].validate(&value) {
                panic!("line {i}: {error}: {content}");
            }
            if i % 5 == 2 {
                // Log probabilities come after the constraint: every chosen
                // token was allowed, so none is impossible.
                for entry in choice["logprobs"]["content"].as_array().unwrap() {
                    assert!(entry["logprob"].as_f64().unwrap().is_finite(), "{entry}");
                }
            }
            outputs += 1;
        }
    }
    println!(
        "structured outputs: {outputs} outputs of {items} json_schema lines parse and validate"
    );
}

#[test]
fn json_object_and_grammar_lines_match_and_bad_schemas_are_refused_at_submit() {
    let _turn = turn();
    let cortex = Cortex::new();
    let lines = [
        json!({"custom_id": "object", "method": "POST", "url": "/v1/chat/completions", "body": {
            "messages": [{"role": "user", "content": "Give the colour red as JSON with keys name and hex."}],
            "max_tokens": 200, "temperature": 0, "response_format": {"type": "json_object"}}}),
        json!({"custom_id": "yes-no", "prompt": "Is the sky blue? Answer:", "max_tokens": 8,
               "grammar": "root ::= \" \"? (\"yes\" | \"no\") \".\""}),
        json!({"custom_id": "digits", "prompt": "The year the moon landing happened:", "max_tokens": 8,
               "temperature": 0.9, "seed": 3, "grammar": "root ::= [1-9] [0-9]{3}"}),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    cortex.write("g.jsonl", &text);
    cortex.ok(&["submit", "g.jsonl"]);
    cortex.ok(&["worker"]);
    cortex.ok(&["results", "1", "-o", "out.jsonl"]);
    let out = read_jsonl(&cortex.dir().join("out.jsonl"));
    let content = out[0]["response"]["body"]["choices"][0]["message"]["content"]
        .as_str()
        .unwrap();
    let object: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {}", out[0]));
    assert!(object.is_object(), "{content}");
    let answer = out[1]["response"]["body"]["choices"][0]["text"]
        .as_str()
        .unwrap();
    assert!(
        [" yes.", " no.", "yes.", "no."].contains(&answer),
        "{answer:?}"
    );
    let year = out[2]["response"]["body"]["choices"][0]["text"]
        .as_str()
        .unwrap();
    assert!(
        year.len() == 4 && year.chars().all(|c| c.is_ascii_digit()) && !year.starts_with('0'),
        "{year:?}"
    );

    // `generate` takes a schema or a grammar file too.
    let schema = cortex.write(
        "fruit.json",
        r#"{"type": "object", "properties": {"fruit": {"type": "string", "maxLength": 20}}, "required": ["fruit"]}"#,
    );
    let text = cortex.ok(&[
        "generate",
        "--chat",
        "--temperature",
        "0",
        "--json-schema",
        schema.to_str().unwrap(),
        "Name a fruit as JSON.",
    ]);
    let fruit: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(fruit["fruit"].is_string(), "{fruit}");

    // Refused at submit, with the line number and what in the schema.
    let bad = [
        text.lines().next().unwrap().to_owned(),
        json!({"custom_id": "zip", "method": "POST", "url": "/v1/chat/completions", "body": {
            "messages": [{"role": "user", "content": "Zip?"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "z", "schema": {
                "type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}}}}})
        .to_string(),
        json!({"custom_id": "g", "prompt": "x", "grammar": "root ::= item+"}).to_string(),
    ];
    cortex.write("bad.jsonl", &format!("{}\n", bad.join("\n")));
    let output = cortex.run(&["submit", "bad.jsonl"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("line 2 (custom_id \"zip\"): body: response_format.json_schema: schema at properties.zip: pattern is not supported"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "line 3 (custom_id \"g\"): grammar line 1: rule item is used but not defined"
        ),
        "{stderr}"
    );
}
