//! Property-based fuzzing of request bodies: objects built from the
//! endpoints' own field names with values of any JSON type (and sometimes
//! of the right one), and bytes that are not JSON at all. Whatever comes
//! in, parsing answers (no panic), a refusal names what is wrong, and a
//! body accepted online means the same work as a batch line carrying it.

use cortex_openai::{Endpoint, line_seed_of, parse_line, parse_request};
use cortex_queue::JobDefaults;
use cortex_request::Work;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

const FIELDS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "input",
    "instructions",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "response_format",
    "grammar",
    "tools",
    "tool_choice",
    "stream",
    "stream_options",
    "echo",
    "suffix",
    "user",
    "metadata",
    "priority",
    "encoding_format",
    "dimensions",
    "role",
    "content",
    "type",
    "json_schema",
    "schema",
    "name",
    "strict",
    "text",
    "function",
    "parameters",
    "include_usage",
    "unknown",
];
const WORDS: &[&str] = &[
    "user",
    "system",
    "assistant",
    "tool",
    "developer",
    "text",
    "json_object",
    "json_schema",
    "function",
    "auto",
    "none",
    "required",
    "float",
    "base64",
    "object",
    "string",
    "hi",
    "",
    "root ::= \"a\"",
];

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-3_i64..40).prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        (0.0..2.0_f64).prop_map(Value::from),
        prop::sample::select(WORDS).prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(8, 120, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(FIELDS), inner), 0..5).prop_map(|fields| {
                Value::Object(
                    fields
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect::<Map<_, _>>(),
                )
            }),
        ]
    })
}

/// A body that is right in its main field half the time, with any other fields.
fn body(endpoint: Endpoint) -> impl Strategy<Value = Value> {
    let main = match endpoint {
        Endpoint::ChatCompletions => {
            json!({"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4})
        }
        Endpoint::Completions => json!({"prompt": "Once", "max_tokens": 4}),
        Endpoint::Responses => json!({"input": "Say hi", "max_output_tokens": 4}),
        _ => json!({"input": "Say hi"}),
    };
    (
        any::<bool>(),
        prop::collection::vec((prop::sample::select(FIELDS), json()), 0..4),
    )
        .prop_map(move |(start_right, extra)| {
            let mut fields = match (start_right, &main) {
                (true, Value::Object(main)) => main.clone(),
                _ => Map::new(),
            };
            for (key, value) in extra {
                fields.insert(key.to_owned(), value);
            }
            Value::Object(fields)
        })
}

fn endpoint() -> impl Strategy<Value = Endpoint> {
    prop_oneof![
        Just(Endpoint::ChatCompletions),
        Just(Endpoint::Completions),
        Just(Endpoint::Responses),
        Just(Endpoint::Embeddings),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3_000))]

    #[test]
    fn a_body_is_read_or_refused_with_a_reason_and_means_the_same_in_a_batch(
        (endpoint, body) in endpoint().prop_flat_map(|e| (Just(e), body(e)))
    ) {
        let text = body.to_string();
        match parse_request(endpoint, text.as_bytes()) {
            Err(error) => prop_assert!(!error.message.is_empty()),
            Ok(online) => {
                let mut fields = body.as_object().cloned().unwrap_or_default();
                fields.remove("stream");
                fields.remove("stream_options");
                let line = json!({"custom_id": "c", "method": "POST", "url": endpoint.url(), "body": fields});
                let item = parse_line(1, &line.to_string(), &JobDefaults::default());
                prop_assert!(item.is_ok(), "accepted online, refused in a batch: {body}: {item:?}");
                // A batch line without a seed of its own draws from one
                // derived from its custom_id; otherwise the same request.
                let mut expected = online.work;
                if let Work::Generate(request) = &mut expected
                    && body.get("seed").is_none_or(Value::is_null)
                {
                    request.sampling.seed = Some(line_seed_of(None, "c"));
                }
                prop_assert_eq!(item.unwrap().request, expected);
            }
        }
    }

    #[test]
    fn any_bytes_are_refused_or_read(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        for endpoint in [Endpoint::ChatCompletions, Endpoint::Completions, Endpoint::Responses, Endpoint::Embeddings] {
            if let Err(error) = parse_request(endpoint, &bytes) {
                prop_assert!(!error.message.is_empty());
            }
        }
        let text = String::from_utf8_lossy(&bytes);
        if let Err(error) = parse_line(7, &text, &JobDefaults::default()) {
            prop_assert_eq!(error.line, 7);
            prop_assert!(!error.message.is_empty());
        }
    }
}
