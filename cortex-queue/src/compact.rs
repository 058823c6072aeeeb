//! How requests and results are stored. Requests: only the fields that differ from a default
//! request, so a pending item costs little more than its prompt. Defaults are
//! filled back in when the item is claimed; a fully spelled-out request (as
//! stored before schema version 3) reads the same.

use cortex_request::{EmbeddingRequest, Request, RequestId, Response, Work};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// A request's fields at their defaults, as JSON, less the prompt (always
/// stored: it is an enum, which member-wise stripping would break) and the id.
fn default_request() -> &'static Map<String, Value> {
    static DEFAULT: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    DEFAULT.get_or_init(|| {
        let Value::Object(mut default) =
            serde_json::to_value(Request::new(RequestId(0), "")).expect("requests serialize")
        else {
            unreachable!("a request serializes as an object")
        };
        default.remove("prompt");
        default.remove("id");
        default
    })
}

/// Removes from `value` every object member equal to the one in `default`
/// (recursively); members `default` lacks stay.
fn strip_defaults(value: &mut Map<String, Value>, default: &Map<String, Value>) {
    value.retain(|key, member| match (default.get(key), member) {
        (Some(Value::Object(default)), Value::Object(member)) => {
            strip_defaults(member, default);
            !member.is_empty()
        }
        (Some(default), member) => default != member,
        (None, _) => true,
    });
}

/// Puts `default`'s members back where `value` lacks them (recursively).
fn fill_defaults(value: &mut Map<String, Value>, default: &Map<String, Value>) {
    for (key, default) in default {
        match (value.get_mut(key), default) {
            (Some(Value::Object(member)), Value::Object(default)) => fill_defaults(member, default),
            (Some(_), _) => {}
            (None, default) => {
                value.insert(key.clone(), default.clone());
            }
        }
    }
}

/// The stored form of `request`: its non-default fields (the id is the
/// item's and is not stored).
pub(crate) fn compact_request(request: &Request) -> String {
    let mut value = serde_json::to_value(request).expect("requests serialize");
    if let Value::Object(members) = &mut value {
        strip_defaults(members, default_request());
        members.remove("id");
    }
    value.to_string()
}

/// The member of a stored request that names its grammar in `grammars`.
const GRAMMAR_REF: &str = "grammar_sha256";

/// The stored form of `request` when its grammar is kept apart: the request
/// without it but with its SHA-256 (see [`GRAMMAR_REF`]), and the grammar's
/// (SHA-256, text) to store once in `grammars`.
pub(crate) fn compact_request_apart(request: &Request) -> (String, Option<(String, &str)>) {
    let Some(grammar) = request.grammar.as_deref() else {
        return (compact_request(request), None);
    };
    let sha = format!("{:x}", Sha256::digest(grammar.as_bytes()));
    let mut without = request.clone();
    without.grammar = None;
    let mut value: Value = serde_json::from_str(&compact_request(&without)).expect("just written");
    if let Value::Object(members) = &mut value {
        members.insert(GRAMMAR_REF.into(), Value::String(sha.clone()));
    }
    (value.to_string(), Some((sha, grammar)))
}

/// The member of a stored item that holds an embedding request (a
/// generation request is stored as itself, with `prompt` always present).
const EMBED: &str = "embed";

/// The stored form of `work` (see `compact_request_apart`; an embedding
/// request is `{"embed": {"inputs": [...]}}`).
pub fn compact_work_apart(work: &Work) -> (String, Option<(String, &str)>) {
    match work {
        Work::Generate(request) => compact_request_apart(request),
        Work::Embed(request) => {
            let mut value = serde_json::to_value(request).expect("requests serialize");
            if let Value::Object(members) = &mut value {
                members.remove("id");
            }
            (serde_json::json!({ EMBED: value }).to_string(), None)
        }
        other => unreachable!("every kind of work is stored: {other:?}"),
    }
}

/// The work stored as `text` by [`compact_work_apart`] (or a request in
/// any earlier stored form).
pub fn expand_work_with(
    text: &str,
    grammar: impl FnOnce(&str) -> Option<String>,
) -> Result<Work, String> {
    if text.starts_with("{\"embed\"") {
        let mut value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let mut embed = value
            .get_mut(EMBED)
            .map(Value::take)
            .ok_or("no embedding request")?;
        if let Value::Object(members) = &mut embed {
            members.insert("id".into(), Value::from(0));
        }
        let request: EmbeddingRequest = serde_json::from_value(embed).map_err(|e| e.to_string())?;
        return Ok(Work::Embed(request));
    }
    expand_request_with(text, grammar).map(Work::Generate)
}

/// The request stored as `text` (by [`compact_request`],
/// [`compact_request_apart`] or in full), its grammar fetched by SHA-256
/// with `grammar` when it was kept apart.
pub(crate) fn expand_request_with(
    text: &str,
    grammar: impl FnOnce(&str) -> Option<String>,
) -> Result<Request, String> {
    let mut value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if let Value::Object(members) = &mut value
        && let Some(sha) = members.remove(GRAMMAR_REF)
    {
        let sha = sha.as_str().unwrap_or_default().to_owned();
        let text = grammar(&sha).ok_or_else(|| format!("its grammar {sha} is missing"))?;
        members.insert("grammar".into(), Value::String(text));
    }
    expand_request(&value.to_string()).map_err(|e| e.to_string())
}

/// The stored form of a result: the response without its token ids (the
/// text is what outputs carry).
pub fn compact_response(response: &Response) -> String {
    let mut stored = response.clone();
    for completion in &mut stored.completions {
        completion.tokens = Vec::new();
    }
    serde_json::to_string(&stored).expect("responses serialize")
}

/// The request stored as `text` by [`compact_request`] (or in full).
pub(crate) fn expand_request(text: &str) -> serde_json::Result<Request> {
    let mut value: Value = serde_json::from_str(text)?;
    if let Value::Object(members) = &mut value {
        members.entry("id").or_insert(Value::from(0));
        fill_defaults(members, default_request());
    }
    serde_json::from_value(value)
}

#[cfg(test)]
mod tests {
    use cortex_request::{Prompt, SamplingParams, StopConditions};

    use super::*;

    #[test]
    fn a_default_request_stores_only_its_prompt() {
        let request = Request::new(RequestId(7), "Hello");
        let stored = compact_request(&request);
        assert_eq!(stored, r#"{"prompt":{"text":"Hello"}}"#);
        let mut back = expand_request(&stored).unwrap();
        back.id = request.id;
        assert_eq!(back, request);
    }

    #[test]
    fn non_default_fields_survive_the_round_trip() {
        let mut request = Request::new(RequestId(1), Prompt::Tokens(vec![1, 2, 3]));
        assert_eq!(
            compact_request(&request),
            r#"{"prompt":{"tokens":[1,2,3]}}"#
        );
        request.sampling = SamplingParams {
            temperature: 0.0,
            top_k: 5,
            seed: Some(9),
            ..SamplingParams::default()
        };
        request.sampling.logit_bias.insert(42, -1.5);
        request.stop = StopConditions {
            stop: vec!["\n".into()],
            ..StopConditions::max_tokens(16)
        };
        request.n = 3;
        request.priority = -2;
        let mut back = expand_request(&compact_request(&request)).unwrap();
        back.id = request.id;
        assert_eq!(back, request);
    }

    #[test]
    fn a_grammar_kept_apart_comes_back() {
        let mut request = Request::new(RequestId(1), "Hi");
        request.grammar = Some("root ::= \"yes\"".into());
        let (stored, grammar) = compact_request_apart(&request);
        let (sha, text) = grammar.unwrap();
        assert_eq!(text, "root ::= \"yes\"");
        // Compared as JSON: key order follows serde_json's `preserve_order`,
        // which another crate in the build may switch on.
        let stored_json: Value = serde_json::from_str(&stored).unwrap();
        assert_eq!(
            stored_json,
            serde_json::json!({"prompt": {"text": "Hi"}, "grammar_sha256": sha})
        );
        let mut back =
            expand_request_with(&stored, |s| (s == sha).then(|| text.to_owned())).unwrap();
        back.id = request.id;
        assert_eq!(back, request);
        assert_eq!(
            expand_request_with(&stored, |_| None).unwrap_err(),
            format!("its grammar {sha} is missing")
        );
        // Without a grammar, the plain stored form.
        let plain = Request::new(RequestId(2), "Hi");
        assert_eq!(
            compact_request_apart(&plain),
            (compact_request(&plain), None)
        );
    }

    #[test]
    fn an_embedding_request_round_trips() {
        let request = EmbeddingRequest::new(RequestId(4), vec!["a".into(), vec![7, 8].into()]);
        let work = Work::Embed(request.clone());
        let (stored, grammar) = compact_work_apart(&work);
        assert_eq!(
            stored,
            r#"{"embed":{"inputs":[{"text":"a"},{"tokens":[7,8]}]}}"#
        );
        assert!(grammar.is_none());
        let mut back = expand_work_with(&stored, |_| None).unwrap();
        back.set_id(request.id);
        assert_eq!(back, Work::Embed(request));
        // A generation request reads as one.
        let plain = Request::new(RequestId(0), "Hi");
        assert_eq!(
            expand_work_with(&compact_request(&plain), |_| None).unwrap(),
            Work::Generate(plain)
        );
    }

    #[test]
    fn a_request_stored_in_full_still_reads() {
        let request = Request::new(RequestId(3), "Hi");
        let full = serde_json::to_string(&request).unwrap();
        assert_eq!(expand_request(&full).unwrap(), request);
    }
}
