//! Reading a job's JSONL input: both line formats (OpenAI batch lines and
//! plain `{"prompt"...}` / `{"messages"...}` lines), every check, streaming.

use std::io::BufRead;

use cortex_queue::{JobDefaults, LineError, LineResult, NewItem};
use cortex_request::{
    Limits, Prompt, Request, RequestId, SamplingParams, StopConditions, TokenId, ToolChoice, Work,
};
use serde_json::{Map, Value};

use crate::Endpoint;
use crate::endpoint::output_tag;

mod embedding;
mod format;
mod prompt;
mod tools;
mod variables;

use embedding::{EmbeddingLine, embedding_from};
use format::{constraint_fields, grammar_of};
use prompt::{completion_prompt, messages, response_input};
use tools::{TOOL_FIELDS, response_tools_of, tools_of};
use variables::{omit_reasoning, template_variables, variable_fields};

/// Sampling and stop fields accepted on both formats.
const SAMPLING_FIELDS: [&str; 17] = [
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "stop_token_ids",
    "priority",
    "model",
];

pub(crate) type Fields = Map<String, Value>;

fn type_error(field: &str, expected: &str, value: &Value) -> String {
    let shown = match value {
        Value::String(s) if s.chars().count() > 40 => {
            format!("{:?}…", s.chars().take(40).collect::<String>())
        }
        other => other.to_string(),
    };
    format!("{field} must be {expected}, not {shown}")
}

fn number(fields: &Fields, field: &str) -> Result<Option<f64>, String> {
    match fields.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(other) => Err(type_error(field, "a number", other)),
    }
}

fn integer(fields: &Fields, field: &str) -> Result<Option<i64>, String> {
    match fields.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.is_i64() => Ok(n.as_i64()),
        Some(Value::Number(n)) if n.is_u64() => Err(format!("{field} = {n} is too large")),
        Some(other) => Err(type_error(field, "an integer", other)),
    }
}

fn unsigned(fields: &Fields, field: &str, max: u64) -> Result<Option<u64>, String> {
    match integer(fields, field)? {
        None => Ok(None),
        Some(v) if v < 0 => Err(format!("{field} = {v} must not be negative")),
        Some(v) if v as u64 > max => Err(format!("{field} = {v} is too large (at most {max})")),
        Some(v) => Ok(Some(v as u64)),
    }
}

fn token_id(value: &Value, field: &str) -> Result<TokenId, String> {
    match value.as_u64() {
        Some(v) if v <= u64::from(u32::MAX) => Ok(v as TokenId),
        _ => Err(type_error(
            field,
            "a token id (a non-negative integer)",
            value,
        )),
    }
}

/// Applies the shared sampling and stop fields to `request`.
fn apply_sampling(fields: &Fields, request: &mut Request) -> Result<(), String> {
    let s: &mut SamplingParams = &mut request.sampling;
    if let Some(v) = number(fields, "temperature")? {
        // OpenAI's range; the engine takes any finite temperature >= 0.
        if !(0.0..=2.0).contains(&v) {
            return Err(format!(
                "temperature = {v} is out of range: expected a number in [0, 2]"
            ));
        }
        s.temperature = v as f32;
    }
    if let Some(v) = number(fields, "top_p")? {
        s.top_p = v as f32;
    }
    if let Some(v) = number(fields, "min_p")? {
        s.min_p = v as f32;
    }
    if let Some(v) = number(fields, "presence_penalty")? {
        s.presence_penalty = v as f32;
    }
    if let Some(v) = number(fields, "frequency_penalty")? {
        s.frequency_penalty = v as f32;
    }
    if let Some(v) = number(fields, "repetition_penalty")? {
        s.repetition_penalty = v as f32;
    }
    if let Some(v) = integer(fields, "top_k")? {
        // vLLM users write -1 for "off"; cortex says 0. Both mean no top-k.
        s.top_k = if v == -1 {
            0
        } else {
            i32::try_from(v).map_err(|_| format!("top_k = {v} is too large"))?
        };
    }
    if let Some(v) = integer(fields, "seed")? {
        s.seed = Some(v as u64);
    }
    match fields.get("logit_bias") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (key, value) in map {
                let token: TokenId = key
                    .parse()
                    .map_err(|_| format!("logit_bias key {key:?} is not a token id"))?;
                let bias = value
                    .as_f64()
                    .ok_or_else(|| type_error(&format!("logit_bias[{key}]"), "a number", value))?;
                s.logit_bias.insert(token, bias as f32);
            }
        }
        Some(other) => {
            return Err(type_error(
                "logit_bias",
                "an object of token id to bias",
                other,
            ));
        }
    }

    let stop: &mut StopConditions = &mut request.stop;
    let max_tokens = match unsigned(fields, "max_tokens", u64::from(u32::MAX))? {
        Some(v) => Some(v),
        None => unsigned(fields, "max_completion_tokens", u64::from(u32::MAX))?,
    };
    if let Some(v) = max_tokens {
        stop.max_tokens = v as u32;
    }
    match fields.get("stop") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => stop.stop = vec![s.clone()],
        Some(Value::Array(items)) => {
            stop.stop = items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| type_error(&format!("stop[{i}]"), "a string", v))
                })
                .collect::<Result<_, _>>()?;
        }
        Some(other) => return Err(type_error("stop", "a string or an array of strings", other)),
    }
    match fields.get("stop_token_ids") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            stop.stop_token_ids = items
                .iter()
                .enumerate()
                .map(|(i, v)| token_id(v, &format!("stop_token_ids[{i}]")))
                .collect::<Result<_, _>>()?;
        }
        Some(other) => return Err(type_error("stop_token_ids", "an array of token ids", other)),
    }
    match fields.get("ignore_eos") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => stop.ignore_eos = *b,
        Some(other) => return Err(type_error("ignore_eos", "true or false", other)),
    }
    if let Some(v) = unsigned(fields, "n", u64::from(u32::MAX))? {
        request.n = v as u32;
    }
    if let Some(v) = integer(fields, "priority")? {
        request.priority =
            i32::try_from(v).map_err(|_| format!("priority = {v} is out of range"))?;
    }
    Ok(())
}

/// The fields that ask for log probabilities on `endpoint`.
fn logprob_fields(endpoint: Endpoint) -> &'static [&'static str] {
    match endpoint {
        Endpoint::ChatCompletions => &["logprobs", "top_logprobs"],
        Endpoint::Completions => &["logprobs", "echo"],
        Endpoint::Responses => &["top_logprobs", "include"],
        Endpoint::Embeddings => &[],
    }
}

/// Completions' `echo`: the prompt before the completion, in the text and
/// (with `logprobs`) the log probability arrays.
fn echo(fields: &Fields) -> Result<bool, String> {
    match fields.get("echo") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(type_error("echo", "true or false", other)),
    }
}

/// What responses' `include` may ask for here.
const LOGPROBS_INCLUDE: &str = "message.output_text.logprobs";

/// How many alternatives per position to report log probabilities of, if
/// any: chat's `logprobs: true` with `top_logprobs: N`, completions'
/// `logprobs: N`, responses' `include: ["message.output_text.logprobs"]`
/// with `top_logprobs: N`.
fn logprobs_of(fields: &Fields, endpoint: Endpoint) -> Result<Option<u32>, String> {
    let max = u64::from(Request::MAX_TOP_LOGPROBS);
    match endpoint {
        Endpoint::ChatCompletions => {
            let wanted = match fields.get("logprobs") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(other) => return Err(type_error("logprobs", "true or false", other)),
            };
            let top = unsigned(fields, "top_logprobs", max)?;
            match (wanted, top) {
                (false, Some(_)) => Err("top_logprobs needs logprobs: true".into()),
                (false, None) => Ok(None),
                (true, top) => Ok(Some(top.unwrap_or(0) as u32)),
            }
        }
        Endpoint::Completions => Ok(unsigned(fields, "logprobs", max)?.map(|n| n as u32)),
        Endpoint::Responses => {
            let wanted = match fields.get("include") {
                None | Some(Value::Null) => false,
                Some(Value::Array(items)) => {
                    if let Some(other) = items.iter().find(|i| *i != LOGPROBS_INCLUDE) {
                        return Err(format!(
                            "include {other} is not available here (only {LOGPROBS_INCLUDE:?}: cortex has no tools, files or reasoning to report)"
                        ));
                    }
                    !items.is_empty()
                }
                Some(other) => return Err(type_error("include", "an array of strings", other)),
            };
            match (wanted, unsigned(fields, "top_logprobs", max)?) {
                (false, Some(_)) => Err(format!(
                    "top_logprobs needs include: [{LOGPROBS_INCLUDE:?}]"
                )),
                (false, None) => Ok(None),
                (true, top) => Ok(Some(top.unwrap_or(0) as u32)),
            }
        }
        Endpoint::Embeddings => Ok(None),
    }
}

/// An unknown field, and the known one it was probably meant to be.
fn unknown_field(key: &str, prompt_field: &str) -> String {
    let known = [prompt_field, "messages", "prompt"]
        .into_iter()
        .chain(SAMPLING_FIELDS.iter().copied());
    match cortex_request::closest_name(key, known) {
        Some(field) => format!("unknown field {key:?}: did you mean {field:?}?"),
        None => format!("unknown field {key:?}"),
    }
}

/// Builds the request from a body (OpenAI) or a whole plain line.
fn request_from(
    fields: &Fields,
    endpoint: Endpoint,
    extra_allowed: &[&str],
    defaults: &JobDefaults,
) -> Result<(Request, Option<String>), String> {
    let prompt_field = match endpoint {
        Endpoint::ChatCompletions => "messages",
        Endpoint::Completions => "prompt",
        Endpoint::Responses | Endpoint::Embeddings => "input",
    };
    for (key, value) in fields {
        if key == prompt_field
            || (endpoint == Endpoint::Responses
                && ["instructions", "max_output_tokens"].contains(&key.as_str()))
            || SAMPLING_FIELDS.contains(&key.as_str())
            || logprob_fields(endpoint).contains(&key.as_str())
            || constraint_fields(endpoint).contains(&key.as_str())
            || (matches!(endpoint, Endpoint::ChatCompletions | Endpoint::Responses)
                && TOOL_FIELDS.contains(&key.as_str()))
            || variable_fields(endpoint).contains(&key.as_str())
            || extra_allowed.contains(&key.as_str())
            || crate::fields::check(endpoint, key, value)?
        {
            continue;
        }
        return Err(unknown_field(key, prompt_field));
    }
    let prompt = match (endpoint, fields.get(prompt_field)) {
        (_, None | Some(Value::Null)) => return Err(format!("missing {prompt_field}")),
        (Endpoint::ChatCompletions, Some(v)) => Prompt::Chat(messages(v)?),
        (Endpoint::Completions, Some(v)) => completion_prompt(v)?,
        (Endpoint::Responses, Some(_)) => Prompt::Chat(response_input(fields)?),
        (Endpoint::Embeddings, Some(_)) => unreachable!("embeddings are read by embedding_from"),
    };
    let model = match fields.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.clone()),
        Some(other) => return Err(type_error("model", "a string", other)),
    };
    let prompt = match (prompt, &defaults.system) {
        (Prompt::Chat(mut messages), Some(system))
            if !messages
                .iter()
                .any(|m| m.role == "system" || m.role == "developer") =>
        {
            messages.insert(0, cortex_request::ChatMessage::system(system));
            Prompt::Chat(messages)
        }
        (prompt, _) => prompt,
    };
    let mut request = Request::new(RequestId(0), prompt);
    request.sampling = defaults.sampling.clone();
    request.stop = defaults.stop.clone();
    apply_sampling(fields, &mut request)?;
    request.logprobs = logprobs_of(fields, endpoint)?;
    if endpoint == Endpoint::Completions && echo(fields)? {
        // The prompt comes back before the completion, its tokens scored
        // with as many alternatives as the completion's.
        request.prompt_logprobs = Some(request.logprobs.unwrap_or(0));
    }
    request.grammar = grammar_of(fields, endpoint)?;
    if matches!(endpoint, Endpoint::ChatCompletions | Endpoint::Responses) {
        let tools = if endpoint == Endpoint::Responses {
            response_tools_of(fields)?
        } else {
            tools_of(fields)?
        };
        let forced = tools.as_ref().is_some_and(|t| t.choice != ToolChoice::Auto);
        if forced && request.grammar.is_some() {
            if fields.get("grammar").is_some_and(|g| !g.is_null()) {
                return Err("a forced tool call (tool_choice required or a function) and a grammar cannot both constrain the output".into());
            }
            // A text format shapes the message's text; a forced call's
            // answer is the call, which its function's schema shapes (as
            // OpenAI takes both: instructor's RESPONSES_TOOLS sends both).
            request.grammar = None;
        }
        request.tools = tools;
    }
    if matches!(endpoint, Endpoint::ChatCompletions | Endpoint::Responses) {
        request.template_variables = template_variables(fields, endpoint)?;
        request.omit_reasoning = omit_reasoning(fields, defaults.omit_reasoning)?;
    }
    if endpoint == Endpoint::Responses {
        if let Some(v) = unsigned(fields, "max_output_tokens", u64::from(u32::MAX))? {
            request.stop.max_tokens = v as u32;
        }
        if request.n != 1 {
            return Err("n is not a /v1/responses field (a response has one output); use /v1/chat/completions for several".into());
        }
    }
    request
        .validate(&Limits::default())
        .map_err(|e| e.to_string())?;
    Ok((request, model))
}

/// Reads the body of a request to `endpoint` (a batch line's `body`, or an
/// online request): the output tag, the work and the `model` it named.
pub(crate) fn body_work(
    endpoint: Endpoint,
    body: &Fields,
    defaults: &JobDefaults,
) -> Result<(String, Work, Option<String>), String> {
    if endpoint == Endpoint::Embeddings {
        let EmbeddingLine {
            request,
            model,
            base64,
        } = embedding_from(body)?;
        Ok((output_tag(endpoint, base64), Work::Embed(request), model))
    } else {
        let (request, model) = request_from(body, endpoint, &[], defaults)?;
        Ok((output_tag(endpoint, false), Work::Generate(request), model))
    }
}

fn custom_id_of(fields: &Fields) -> Result<Option<String>, String> {
    match fields.get("custom_id") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Err("custom_id is empty".into()),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        // Numbers are common in hand-written files; keep them as text.
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(other) => Err(type_error("custom_id", "a string", other)),
    }
}

/// Parses one line's text (already known to be UTF-8, without its line ending);
/// fields the line does not set come from `defaults`.
///
/// ```
/// use cortex_openai::parse_line;
/// use cortex_queue::JobDefaults;
///
/// let item = parse_line(1, r#"{"prompt": "Hi", "max_tokens": 4}"#, &JobDefaults::default()).unwrap();
/// assert_eq!((item.custom_id.as_str(), item.endpoint.as_str(), item.request.as_generate().unwrap().stop.max_tokens), ("1", "/v1/completions", 4));
///
/// let error = parse_line(7, r#"{"prompt": "Hi", "top_p": 2}"#, &JobDefaults::default()).unwrap_err();
/// assert_eq!(error.to_string(), "line 7: top_p = 2 is out of range: expected a number in (0, 1]");
/// ```
pub fn parse_line(line: u64, text: &str, defaults: &JobDefaults) -> Result<NewItem, LineError> {
    parse_line_form(line, text, defaults).map(|(item, _)| item)
}

/// How a line is written: an OpenAI batch line (`custom_id`, `method`,
/// `url`, `body`), naming its endpoint, or a plain one (`prompt` or
/// `messages` and the request's fields), whose endpoint follows from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LineForm {
    Batch,
    Plain,
}

/// [`parse_line`], and the line's form.
fn parse_line_form(
    line: u64,
    text: &str,
    defaults: &JobDefaults,
) -> Result<(NewItem, LineForm), LineError> {
    let error = |custom_id: Option<String>, message: String| LineError {
        line,
        custom_id,
        message,
    };
    let value: Value = serde_json::from_str(text).map_err(|e| {
        // The line number is the file's; serde's "line 1" would only confuse.
        let detail = e.to_string().replace(" at line 1 column ", " at column ");
        error(None, format!("invalid JSON: {detail}"))
    })?;
    let Value::Object(fields) = value else {
        return Err(error(None, "expected a JSON object".into()));
    };
    let custom_id = custom_id_of(&fields).map_err(|m| error(None, m))?;
    let fail = |m: String| error(custom_id.clone(), m);
    let (tag, (request, model)) = if fields.contains_key("body") || fields.contains_key("url") {
        // OpenAI batch line.
        if let Some(key) = fields
            .keys()
            .find(|k| !["custom_id", "method", "url", "body"].contains(&k.as_str()))
        {
            return Err(fail(format!("unknown field {key:?}")));
        }
        if custom_id.is_none() {
            return Err(fail(
                "missing custom_id (OpenAI batch lines need one)".into(),
            ));
        }
        match fields.get("method") {
            Some(Value::String(m)) if m == "POST" => {}
            Some(Value::String(m)) => {
                return Err(fail(format!("method {m:?} is not supported; use \"POST\"")));
            }
            None => return Err(fail("missing method".into())),
            Some(other) => return Err(fail(type_error("method", "\"POST\"", other))),
        }
        let endpoint = match fields.get("url") {
            Some(Value::String(url)) => Endpoint::from_url(url).ok_or_else(|| {
                fail(format!("url {url:?} is not supported; use \"/v1/chat/completions\", \"/v1/completions\", \"/v1/responses\" or \"/v1/embeddings\""))
            })?,
            None => return Err(fail("missing url".into())),
            Some(other) => return Err(fail(type_error("url", "a string", other))),
        };
        let body = match fields.get("body") {
            Some(Value::Object(body)) => body,
            None => return Err(fail("missing body".into())),
            Some(other) => return Err(fail(type_error("body", "an object", other))),
        };
        let (tag, work, model) =
            body_work(endpoint, body, defaults).map_err(|m| fail(format!("body: {m}")))?;
        (tag, (work, model))
    } else {
        let endpoint = match (
            fields.contains_key("messages"),
            fields.contains_key("prompt"),
        ) {
            (true, true) => return Err(fail("has both prompt and messages; give one".into())),
            (true, false) => Endpoint::ChatCompletions,
            (false, true) => Endpoint::Completions,
            // A misspelt field says so, rather than that the prompt is missing.
            (false, false) => {
                return Err(fail(
                    request_from(&fields, Endpoint::Completions, &["custom_id"], defaults)
                        .err()
                        .filter(|e| e.starts_with("unknown field"))
                        .unwrap_or_else(|| "missing prompt (or messages)".into()),
                ));
            }
        };
        let (request, model) =
            request_from(&fields, endpoint, &["custom_id"], defaults).map_err(fail)?;
        (
            output_tag(endpoint, false),
            (Work::Generate(request), model),
        )
    };
    let form = if fields.contains_key("body") || fields.contains_key("url") {
        LineForm::Batch
    } else {
        LineForm::Plain
    };
    let line_seed = match form {
        LineForm::Batch => fields.get("body").and_then(|body| body.get("seed")),
        LineForm::Plain => fields.get("seed"),
    };
    let custom_id = custom_id.unwrap_or_else(|| line.to_string());
    let mut request = request;
    if let Work::Generate(request) = &mut request
        && line_seed.is_none_or(Value::is_null)
    {
        request.sampling.seed = Some(line_seed_of(defaults.sampling.seed, &custom_id));
    }
    let item = NewItem {
        line,
        custom_id,
        endpoint: tag,
        model,
        request,
    };
    Ok((item, form))
}

/// The seed of a line that sets none: derived from its `custom_id` and the
/// job's seed (0 when the job has none), so that a sampled line draws the
/// same tokens wherever it sits in its file, whatever runs beside it, and
/// in every run of the job; two lines draw apart. (FNV-1a over the id, then
/// splitmix64's mix: fixed here, not left to a hasher that may change.)
pub fn line_seed_of(job_seed: Option<u64>, custom_id: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in custom_id.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut z = hash ^ job_seed.unwrap_or(0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Reads a JSONL stream line by line, never holding more than one line:
/// strips a BOM and CR line endings, skips blank lines, and reports non-UTF-8
/// bytes and a last line cut off mid-JSON. (Duplicate `custom_id`s are found
/// by the store's unique index, so no set of ids is held in memory.)
pub struct InputReader<R> {
    reader: R,
    line: u64,
    buffer: Vec<u8>,
    defaults: JobDefaults,
    /// The form of the last line read, when it parsed.
    last_form: Option<LineForm>,
}

impl<R: BufRead> InputReader<R> {
    /// Reads from `reader`; fields a line does not set come from `defaults`.
    pub fn new(reader: R, defaults: JobDefaults) -> Self {
        Self {
            reader,
            line: 0,
            buffer: Vec::new(),
            defaults,
            last_form: None,
        }
    }

    /// The form of the line the last item came from.
    pub(crate) fn last_form(&self) -> Option<LineForm> {
        self.last_form
    }

    /// The reader, to collect what it saw (e.g. a hash).
    pub fn into_inner(self) -> R {
        self.reader
    }

    /// The reader, to look at what it saw so far (e.g. a hash).
    pub fn get_ref(&self) -> &R {
        &self.reader
    }

    /// Lines read so far.
    pub fn lines_read(&self) -> u64 {
        self.line
    }
}

impl<R: BufRead> Iterator for InputReader<R> {
    type Item = std::io::Result<LineResult>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.buffer.clear();
            match self.reader.read_until(b'\n', &mut self.buffer) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(e) => return Some(Err(e)),
            }
            self.line += 1;
            let line = self.line;
            let ended = self.buffer.last() == Some(&b'\n');
            let mut bytes: &[u8] = &self.buffer;
            if ended {
                bytes = &bytes[..bytes.len() - 1];
            }
            if bytes.last() == Some(&b'\r') {
                bytes = &bytes[..bytes.len() - 1];
            }
            if line == 1 && bytes.starts_with(b"\xEF\xBB\xBF") {
                bytes = &bytes[3..];
            }
            self.last_form = None;
            let text = match std::str::from_utf8(bytes) {
                Ok(text) => text,
                Err(e) => {
                    return Some(Ok(Err(LineError {
                        line,
                        custom_id: None,
                        message: format!(
                            "not valid UTF-8 (byte 0x{:02X} at column {})",
                            bytes[e.valid_up_to()],
                            e.valid_up_to() + 1
                        ),
                    })));
                }
            };
            if text.trim().is_empty() {
                continue;
            }
            let mut parsed = parse_line_form(line, text, &self.defaults).map(|(item, form)| {
                self.last_form = Some(form);
                item
            });
            if let Err(e) = &mut parsed
                && let Some(detail) = e.message.strip_prefix("invalid JSON: ").filter(|_| !ended)
            {
                e.message =
                    format!("the last line is cut off (no newline at its end, and {detail})");
            }
            return Some(Ok(parsed));
        }
    }
}

#[cfg(test)]
mod tests {
    use cortex_request::ChatMessage;

    use super::*;

    #[test]
    fn a_forced_call_with_a_text_format_is_held_to_the_call() {
        let line = |key: &str, value: Value| {
            let mut line = serde_json::json!({"custom_id": "a", "messages": [{"role": "user", "content": "Hi"}],
                "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"});
            line[key] = value;
            parse_line(1, &line.to_string(), &JobDefaults::default())
        };
        let format = serde_json::json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}});
        let parsed = line("response_format", format).unwrap();
        let request = parsed.request.as_generate().unwrap();
        assert!(request.grammar.is_none() && request.tools.is_some());
        // A grammar of the caller's own and a forced call: two constraints.
        let error = line("grammar", serde_json::json!("root ::= \"x\"")).unwrap_err();
        assert!(
            error.to_string().contains("cannot both constrain"),
            "{error}"
        );
    }

    #[test]
    fn a_line_without_a_seed_draws_from_its_custom_id_and_the_jobs_seed() {
        let seed = |line: u64, text: &str, job: Option<u64>| {
            let mut defaults = JobDefaults::default();
            defaults.sampling.seed = job;
            parse_line(line, text, &defaults)
                .unwrap()
                .request
                .as_generate()
                .unwrap()
                .sampling
                .seed
        };
        let a = r#"{"custom_id": "a", "prompt": "Hi", "temperature": 0.8}"#;
        let b = r#"{"custom_id": "b", "prompt": "Hi", "temperature": 0.8}"#;
        // Wherever it sits in the file: the same; another id: another.
        assert_eq!(seed(1, a, None), seed(40, a, None));
        assert_eq!(seed(1, a, None), Some(line_seed_of(None, "a")));
        assert_ne!(seed(1, a, None), seed(1, b, None));
        // The job's seed takes part; a line's own seed is kept as it is.
        assert_ne!(seed(1, a, Some(7)), seed(1, a, None));
        assert_eq!(seed(3, a, Some(7)), seed(9, a, Some(7)));
        let own = r#"{"custom_id": "a", "prompt": "Hi", "seed": 5}"#;
        assert_eq!(seed(1, own, Some(7)), Some(5));
        let batch = r#"{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Hi"}}"#;
        assert_eq!(seed(1, batch, None), Some(line_seed_of(None, "a")));
    }

    fn logprobs(line: &str) -> Result<Option<u32>, String> {
        parse_line(1, line, &JobDefaults::default())
            .map(|item| item.request.as_generate().unwrap().logprobs)
            .map_err(|e| e.message)
    }

    fn grammar(line: &str) -> Result<Option<String>, String> {
        parse_line(1, line, &JobDefaults::default())
            .map(|item| item.request.as_generate().unwrap().grammar.clone())
            .map_err(|e| e.message)
    }

    #[test]
    fn a_misspelt_field_is_named_and_temperature_keeps_openais_range() {
        let error = |line: &str| {
            parse_line(3, line, &JobDefaults::default())
                .unwrap_err()
                .message
        };
        assert_eq!(
            error(r#"{"promt": "hi"}"#),
            "unknown field \"promt\": did you mean \"prompt\"?"
        );
        assert_eq!(error(r#"{"zzz": 1}"#), "unknown field \"zzz\"");
        assert_eq!(
            error(r#"{"max_tokens": 3}"#),
            "missing prompt (or messages)"
        );
        assert_eq!(
            error(r#"{"prompt": "hi", "temperature": 5}"#),
            "temperature = 5 is out of range: expected a number in [0, 2]"
        );
        assert!(
            parse_line(
                3,
                r#"{"prompt": "hi", "temperature": 2}"#,
                &JobDefaults::default()
            )
            .is_ok()
        );
    }

    #[test]
    fn a_completions_prompt_may_be_a_list_of_texts_or_token_lists() {
        let prompt = |line: &str| {
            parse_line(1, line, &JobDefaults::default())
                .map(|item| item.request.as_generate().unwrap().prompt.clone())
                .map_err(|e| e.message)
        };
        let text = |t: &str| Prompt::Text(t.into());
        assert_eq!(prompt(r#"{"prompt": ["a"]}"#), Ok(text("a")));
        assert_eq!(
            prompt(r#"{"prompt": [1, 2]}"#),
            Ok(Prompt::Tokens(vec![1, 2]))
        );
        assert_eq!(
            prompt(r#"{"prompt": [[1, 2]]}"#),
            Ok(Prompt::Tokens(vec![1, 2]))
        );
        assert_eq!(
            prompt(r#"{"prompt": ["a", "b"], "n": 2}"#),
            Ok(Prompt::Several(vec![text("a"), text("b")]))
        );
        assert_eq!(
            prompt(r#"{"prompt": [[1], "b"]}"#),
            Ok(Prompt::Several(vec![Prompt::Tokens(vec![1]), text("b")]))
        );
        assert_eq!(
            prompt(r#"{"prompt": []}"#),
            Err("prompt is an empty array".into())
        );
        assert_eq!(
            prompt(r#"{"prompt": ["a", [1, -2]]}"#),
            Err("prompt[1][1] must be a token id (a non-negative integer), not -2".into())
        );
        assert_eq!(
            prompt(r#"{"prompt": ["a", {"x": 1}]}"#),
            Err(r#"prompt[1] must be a string or an array of token ids, not {"x":1}"#.into())
        );
        assert_eq!(
            prompt(r#"{"prompt": ["a", ""]}"#),
            Err("prompt is empty".into())
        );
        // n completions of each prompt stay within the request's bound.
        let many = vec!["\"x\""; 17].join(", ");
        assert_eq!(
            prompt(&format!(r#"{{"prompt": [{many}], "n": 64}}"#)),
            Err("prompt has 17 entries; at most 16 are allowed".into())
        );
    }

    #[test]
    fn a_default_system_prompt_goes_before_chats_without_one() {
        let defaults = JobDefaults {
            system: Some("Be brief.".into()),
            ..JobDefaults::default()
        };
        let messages = |line: &str| match &parse_line(1, line, &defaults)
            .unwrap()
            .request
            .as_generate()
            .unwrap()
            .prompt
        {
            Prompt::Chat(messages) => messages.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            messages(r#"{"messages": [{"role": "user", "content": "Hi"}]}"#),
            [ChatMessage::system("Be brief."), ChatMessage::user("Hi")]
        );
        assert_eq!(
            messages(
                r#"{"messages": [{"role": "system", "content": "Mine."}, {"role": "user", "content": "Hi"}]}"#
            ),
            [ChatMessage::system("Mine."), ChatMessage::user("Hi")]
        );
    }

    #[test]
    fn structured_output_fields_compile_at_submit() {
        let chat = |extra: &str| {
            grammar(&format!(
                r#"{{"messages": [{{"role": "user", "content": "Hi"}}]{extra}}}"#
            ))
        };
        assert_eq!(chat(r#", "response_format": {"type": "text"}"#), Ok(None));
        assert_eq!(
            chat(r#", "response_format": {"type": "json_object"}"#),
            Ok(Some(cortex_grammar::json_object()))
        );
        let schema = chat(
            r#", "response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true, "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false}}}"#,
        )
        .unwrap()
        .unwrap();
        assert!(
            schema.contains(r#""\"a\"" space ":" space integer"#),
            "{schema}"
        );
        assert_eq!(
            chat(r#", "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "string", "pattern": "x+"}}}"#),
            Err("response_format.json_schema: schema: pattern is not supported (a regular expression constraint)".into())
        );
        assert_eq!(
            chat(
                r#", "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {}, "strict": true, "extra": 1}}"#
            ),
            Err("response_format.json_schema has unknown field \"extra\"".into())
        );
        assert_eq!(
            chat(r#", "response_format": {"type": "yaml"}"#),
            Err(
                "response_format.type \"yaml\" is not one of text, json_object, json_schema".into()
            )
        );
        assert_eq!(
            chat(
                r#", "grammar": "root ::= \"yes\" | \"no\"", "response_format": {"type": "json_object"}"#
            ),
            Err("give a JSON format or a grammar, not both".into())
        );
        assert_eq!(
            grammar(r#"{"prompt": "Hi", "grammar": "root ::= answer"}"#),
            Err("grammar line 1: rule answer is used but not defined".into())
        );
        assert_eq!(
            grammar(r#"{"prompt": "Hi", "grammar": "root ::= [0-9]+"}"#),
            Ok(Some("root ::= [0-9]+".into()))
        );
        assert_eq!(
            grammar(r#"{"prompt": "Hi", "response_format": {"type": "json_object"}}"#),
            Err("unknown field \"response_format\"".into())
        );
    }

    #[test]
    fn responses_lines_become_chats() {
        let line = |body: &str| {
            parse_line(
                1,
                &format!(r#"{{"custom_id": "r", "method": "POST", "url": "/v1/responses", "body": {body}}}"#),
                &JobDefaults::default(),
            )
            .map_err(|e| e.message)
        };
        let item = line(
            r#"{"model": "m", "instructions": "Be brief.", "input": "Hi", "max_output_tokens": 9, "store": true, "truncation": "disabled"}"#,
        )
        .unwrap();
        assert_eq!(item.endpoint, "/v1/responses");
        assert_eq!(
            item.request.as_generate().unwrap().prompt,
            Prompt::Chat(vec![
                ChatMessage::system("Be brief."),
                ChatMessage::user("Hi"),
            ])
        );
        assert_eq!(item.request.as_generate().unwrap().stop.max_tokens, 9);
        let item = line(
            r#"{"input": [{"role": "developer", "content": "Rules."}, {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "A"}, {"type": "input_text", "text": "B"}]}],
                "text": {"format": {"type": "json_schema", "name": "x", "strict": true, "schema": {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}}}}"#,
        )
        .unwrap();
        assert_eq!(
            item.request.as_generate().unwrap().prompt,
            // The developer message as such (the template decides how it
            // renders), parts kept, and joined by a newline as llama.cpp
            // joins them for templates that do not walk them.
            Prompt::Chat(vec![
                ChatMessage::new("developer", "Rules."),
                ChatMessage::from_parts("user", vec!["A".into(), "B".into()]),
            ])
        );
        assert!(
            item.request
                .as_generate()
                .unwrap()
                .grammar
                .clone()
                .unwrap()
                .contains("boolean")
        );
        assert_eq!(
            line(r#"{"input": "Hi", "previous_response_id": "resp_1"}"#).unwrap_err(),
            "body: previous_response_id = \"resp_1\" is an OpenAI field cortex does not support: a batch line stands alone; put the whole conversation in input"
        );
        assert_eq!(
            line(r#"{"input": [{"type": "function_call_output", "call_id": "c"}]}"#).unwrap_err(),
            "body: input[0].output is missing"
        );
        assert_eq!(
            line(r#"{"input": [{"type": "input_file", "file_id": "f"}]}"#).unwrap_err(),
            "body: input[0] has type \"input_file\"; message, function_call and function_call_output items are supported (no files or built-in tools)"
        );
        // Function tools, a call and its result in the input, as chats have them.
        let item = line(
            r#"{"input": [{"role": "user", "content": "Weather?"},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}],
                "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
                "tool_choice": {"type": "function", "name": "get_weather"}}"#,
        )
        .unwrap();
        let request = item.request.as_generate().unwrap();
        let tools = request.tools.as_ref().unwrap();
        assert_eq!(tools.choice, ToolChoice::Function("get_weather".into()));
        assert!(
            tools
                .definitions
                .contains(r#""function":{"name":"get_weather""#)
        );
        let Prompt::Chat(messages) = &request.prompt else {
            unreachable!()
        };
        assert_eq!(messages[1].tool_calls[0].name, "get_weather");
        assert_eq!(messages[2].tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(
            line(r#"{"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "string", "format": "email"}}}}"#).unwrap_err(),
            "body: text.format: schema at format: format \"email\" is not supported (supported: date, time, date-time, uuid)"
        );
        assert!(
            line(r#"{"input": "Hi", "n": 2}"#)
                .unwrap_err()
                .contains("n is not a /v1/responses field")
        );
        assert_eq!(
            line(r#"{"instructions": "x"}"#).unwrap_err(),
            "body: missing input"
        );
    }

    #[test]
    fn log_probability_fields_of_both_endpoints() {
        let chat = |extra: &str| {
            logprobs(&format!(
                r#"{{"messages": [{{"role": "user", "content": "Hi"}}]{extra}}}"#
            ))
        };
        assert_eq!(chat(""), Ok(None));
        assert_eq!(chat(r#", "logprobs": false"#), Ok(None));
        assert_eq!(chat(r#", "logprobs": true"#), Ok(Some(0)));
        assert_eq!(
            chat(r#", "logprobs": true, "top_logprobs": 5"#),
            Ok(Some(5))
        );
        assert_eq!(
            chat(r#", "top_logprobs": 5"#),
            Err("top_logprobs needs logprobs: true".into())
        );
        assert_eq!(
            chat(r#", "logprobs": true, "top_logprobs": 21"#),
            Err("top_logprobs = 21 is too large (at most 20)".into())
        );
        assert_eq!(logprobs(r#"{"prompt": "Hi", "logprobs": 3}"#), Ok(Some(3)));
        assert_eq!(logprobs(r#"{"prompt": "Hi", "logprobs": null}"#), Ok(None));
        assert_eq!(
            logprobs(r#"{"prompt": "Hi", "top_logprobs": 3}"#),
            Err("unknown field \"top_logprobs\"".into())
        );
    }
    #[test]
    fn echo_scores_the_prompt_and_allows_no_new_tokens() {
        let prompt_logprobs = |line: &str| {
            parse_line(1, line, &JobDefaults::default())
                .map(|item| item.request.as_generate().unwrap().prompt_logprobs)
                .map_err(|e| e.message)
        };
        assert_eq!(prompt_logprobs(r#"{"prompt": "Hi"}"#), Ok(None));
        assert_eq!(
            prompt_logprobs(r#"{"prompt": "Hi", "echo": false}"#),
            Ok(None)
        );
        assert_eq!(
            prompt_logprobs(r#"{"prompt": "Hi", "echo": true}"#),
            Ok(Some(0))
        );
        assert_eq!(
            prompt_logprobs(
                r#"{"prompt": [1, 2, 3], "echo": true, "logprobs": 1, "max_tokens": 0}"#
            ),
            Ok(Some(1))
        );
        assert_eq!(
            prompt_logprobs(r#"{"prompt": "Hi", "echo": "yes"}"#),
            Err("echo must be true or false, not \"yes\"".into())
        );
        assert!(
            prompt_logprobs(r#"{"prompt": "Hi", "max_tokens": 0}"#)
                .unwrap_err()
                .starts_with("max_tokens = 0 is out of range")
        );
        let chat = parse_line(
            1,
            r#"{"messages": [{"role": "user", "content": "Hi"}], "echo": true}"#,
            &JobDefaults::default(),
        );
        assert!(chat.unwrap_err().message.contains("\"echo\""));
    }

    #[test]
    fn both_formats_parse_with_their_fields_and_job_defaults() {
        let mut defaults = JobDefaults::default();
        defaults.stop.max_tokens = 99;
        defaults.sampling.temperature = 0.25;

        let chat = parse_line(
            3,
            r#"{"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "gpt-x", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_tokens": 12, "top_k": -1, "seed": 5, "stop": ["\n"], "logit_bias": {"42": -100}, "priority": 2}}"#,
            &defaults,
        )
        .unwrap();
        assert_eq!(chat.endpoint, Endpoint::ChatCompletions.url());
        assert_eq!(chat.model.as_deref(), Some("gpt-x"));
        assert_eq!(
            chat.request.as_generate().unwrap().prompt,
            Prompt::Chat(vec![
                ChatMessage::system("Be brief."),
                ChatMessage::from_parts("user", vec!["Hi".into()])
            ])
        );
        let r = chat.request.as_generate().unwrap();
        assert_eq!(
            (
                r.stop.max_tokens,
                r.sampling.temperature,
                r.sampling.top_k,
                r.sampling.seed
            ),
            (12, 0.25, 0, Some(5))
        );
        assert_eq!(
            (
                r.stop.stop.clone(),
                r.sampling.logit_bias.get(&42).copied(),
                r.priority
            ),
            (vec!["\n".to_owned()], Some(-100.0), 2)
        );

        let plain = parse_line(
            9,
            r#"{"prompt": [1, 2, 3], "temperature": 0, "min_p": 0.1, "repetition_penalty": 1.1, "ignore_eos": true, "stop_token_ids": [2], "n": 2}"#,
            &defaults,
        )
        .unwrap();
        assert_eq!(
            (plain.custom_id.as_str(), plain.endpoint.as_str()),
            ("9", Endpoint::Completions.url())
        );
        assert_eq!(
            plain.request.as_generate().unwrap().prompt,
            Prompt::Tokens(vec![1, 2, 3])
        );
        let r = plain.request.as_generate().unwrap();
        assert_eq!(
            (
                r.stop.max_tokens,
                r.sampling.temperature,
                r.sampling.min_p,
                r.n
            ),
            (99, 0.0, 0.1, 2)
        );
        assert!(r.stop.ignore_eos);
        assert_eq!(r.stop.stop_token_ids, [2]);
    }
}
