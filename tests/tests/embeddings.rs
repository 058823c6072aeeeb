//! `/v1/embeddings` batch lines through the `cortex` binary on the real
//! model: vectors of the model's size and unit length, the same text giving
//! the same vector whichever batch it was computed in, base64 equal to the
//! numbers, similar sentences closer than unrelated ones, every body valid
//! for the official `openai` package; bad lines refused at submit.

use base64::Engine as _;
use cortex_tests::{Cortex, python_check, read_jsonl, response_body};
use serde_json::{Value, json};

/// SmolLM2-135M's hidden size.
const N_EMBD: usize = 576;

fn line(custom_id: &str, body: &Value) -> String {
    format!(
        "{}\n",
        json!({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body})
    )
}

fn vectors(body: &Value) -> Vec<Vec<f32>> {
    body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| match &d["embedding"] {
            Value::String(encoded) => base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .unwrap()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect(),
            numbers => numbers
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect(),
        })
        .collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn embeddings_lines_give_unit_vectors_that_do_not_depend_on_their_batch() {
    let cortex = Cortex::new();
    let cat = "The cat sat on the mat.";
    let feline = "A feline rested on the rug.";
    let money = "Quarterly revenue grew by ten percent.";
    let mut text = String::new();
    // Many one-input lines, so the engine packs inputs of different items
    // into one decode; the same text recurs in different places.
    for i in 0..48 {
        let input = match i % 4 {
            0 => cat.to_owned(),
            1 => format!("Sentence number {i} is about nothing in particular."),
            2 => money.to_owned(),
            _ => format!("{i} apples and {} pears.", i * 3),
        };
        text += &line(
            &format!("one-{i}"),
            &json!({"model": "text-embedding-3-small", "input": input}),
        );
    }
    text += &line("three", &json!({"input": [cat, feline, money]}));
    text += &line(
        "base64",
        &json!({"input": [cat, money], "encoding_format": "base64"}),
    );
    text += &line(
        "ids",
        &json!({"input": [[1, 2, 3, 4, 5], [6, 7, 8]], "user": "u-1"}),
    );
    let input = cortex.write("in.jsonl", &text);
    cortex.ok(&["run", "in.jsonl", "-o", "out.jsonl", "--ignore-line-models"]);
    let out_path = cortex.dir().join("out.jsonl");
    let outputs = read_jsonl(&out_path);
    assert_eq!(outputs.len(), 51);

    let report = python_check("validate_openai.py", &[&input, &out_path]);
    assert!(report.contains("51 /v1/embeddings"), "{report}");

    let body = |id: &str| response_body(&outputs, id);
    for output in &outputs {
        let body = &output["response"]["body"];
        assert_eq!(body["object"], "list");
        assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
        assert_eq!(
            body["usage"]["prompt_tokens"],
            body["usage"]["total_tokens"]
        );
        for (index, vector) in vectors(body).iter().enumerate() {
            assert_eq!(body["data"][index]["index"], index);
            assert_eq!(vector.len(), N_EMBD);
            let norm = dot(vector, vector).sqrt();
            assert!(
                (norm - 1.0).abs() < 1e-3,
                "{}: norm {norm}",
                output["custom_id"]
            );
        }
    }

    // The same text, wherever it was computed, is the same vector. With
    // cortex's attention (AVX2 or AVX-512) exactly: a query's result depends only on
    // its own cells. With llama.cpp's, up to what a batch's layout moves: its
    // CPU flash attention walks the KV cells in tiles of 16, so a sequence
    // whose cells straddle a tile boundary sums its softmax in another order
    // (its last bit moves); now and then an activation then rounds to the
    // other 8-bit value, and the layers above carry it on (measured: at most
    // 0.0032 in one element of a unit vector).
    let devices: Value = serde_json::from_str(&cortex.ok(&["devices", "--json"])).unwrap();
    let cortex_attention = devices["cortex_kernels"].is_string()
        && std::env::var("CORTEX_CPU_KERNELS").as_deref() != Ok("llama");
    let tolerance = if cortex_attention { 0.0 } else { 1e-2 };
    let reference = &vectors(&body("one-0"))[0];
    let mut places = vec![
        vectors(&body("three"))[0].clone(),
        vectors(&body("base64"))[0].clone(),
    ];
    places.extend(
        (4..48)
            .step_by(4)
            .map(|i| vectors(&body(&format!("one-{i}")))[0].clone()),
    );
    for other in &places {
        let difference = max_difference(reference, other);
        assert!(
            difference <= tolerance,
            "the same text differs by {difference}"
        );
    }
    let money = max_difference(&vectors(&body("one-2"))[0], &vectors(&body("base64"))[1]);
    assert!(money <= tolerance, "the same text differs by {money}");

    // Meaning: the cat is nearer the feline than the revenue.
    let three = vectors(&body("three"));
    let (near, far) = (dot(&three[0], &three[1]), dot(&three[0], &three[2]));
    assert!(near > far, "cat·feline {near} <= cat·revenue {far}");

    // Token-id inputs are embedded as given.
    assert_eq!(body("ids")["usage"]["prompt_tokens"], 8);
    assert_eq!(vectors(&body("ids")).len(), 2);
}

#[test]
fn bad_embeddings_lines_are_refused_at_submit_with_their_line() {
    let cortex = Cortex::new();
    let text = [
        line("ok", &json!({"input": "fine"})),
        line("dims", &json!({"input": "x", "dimensions": 256})),
        line("empty", &json!({"input": ["a", ""]})),
        line("format", &json!({"input": "x", "encoding_format": "int8"})),
        line("sampling", &json!({"input": "x", "temperature": 0})),
    ]
    .concat();
    cortex.write("bad.jsonl", &text);
    cortex.refused(
        &["submit", "bad.jsonl"],
        &[
            "line 2 (custom_id \"dims\"): body: dimensions = 256 is an OpenAI field cortex does not support",
            "line 3 (custom_id \"empty\"): body: input[1] is empty",
            "line 4 (custom_id \"format\"): body: encoding_format must be \"float\" or \"base64\", not \"int8\"",
            "line 5 (custom_id \"sampling\"): body: unknown field \"temperature\"",
        ],
    );
}
